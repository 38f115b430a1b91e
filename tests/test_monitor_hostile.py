"""Hostile input to the rank monitor, end to end through the real launcher and real NVRx 0.4.1 clients: a
bad request is refused and recorded, a process outside the workers' tree is shut out, and the job goes on."""

from __future__ import annotations

import json
import os
import time

import pytest

from testkit.eventlog import read_log_dir

from testkit.helpers import SCRIPTS, finish, run_launcher, start_launcher

pytestmark = [pytest.mark.timeout(120), pytest.mark.processes]

CLIENT = str(SCRIPTS / "nvrx_client.py")


def _named(records, event):
    return [r for r in records if r["event"] == event]


def test_a_request_whose_rank_is_not_an_integer_is_refused_and_the_job_goes_on(tmp_path):
    res = run_launcher(["--standalone", "--nproc-per-node", "2", "--max-restarts", "0", "--log-dir", str(tmp_path),
                        CLIENT, "odd_request"], timeout=90)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "request answered: Unexpected response" in res.stdout and "rank must be an integer" in res.stdout
    assert "WARNING: rank monitor: launcher socket: refused a workload request: rank must be an integer" in res.stderr
    assert "Traceback" not in res.stderr
    records = read_log_dir(tmp_path)
    warnings = _named(records, "monitor_warning")
    assert len(warnings) == 1 and warnings[0]["local_rank"] is None and warnings[0]["pid"] > 0
    assert not _named(records, "workload_request") and not _named(records, "failure")
    assert _named(records, "end")[-1]["exit_code"] == 0


def test_a_foreign_process_cannot_take_over_a_rank(tmp_path, monkeypatch):
    from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient, RankMonitorClientError
    from nvidia_resiliency_ext.fault_tolerance.data import HeartbeatTimeouts, RankInfo

    ready = tmp_path / "socket_path"
    logs = tmp_path / "logs"
    proc = start_launcher(["--standalone", "--nproc-per-node", "1", "--max-restarts", "0", "--log-dir", str(logs),
                           "--heartbeat-timeout", "10", CLIENT, "steady", "3", str(ready)])
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists(), "the worker never connected"
        # This test process is no descendant of the worker: it claims pid 1 and, if let in, would shorten the
        # rank's heartbeat timeout to 0.5 s and stay silent, so that the healthy rank is declared hung.
        monkeypatch.setenv("FT_RANK_MONITOR_IPC_SOCKET", ready.read_text())
        monkeypatch.setenv("RANK", "0")
        monkeypatch.setattr(RankInfo, "get_for_current_rank",
                            staticmethod(lambda: RankInfo(global_rank=0, local_rank=0, host="elsewhere", pid=1)))
        forger = RankMonitorClient()
        with pytest.raises((RankMonitorClientError, OSError, EOFError)):
            forger.init_workload_monitoring()
            forger._set_calculated_timeouts(HeartbeatTimeouts(0.5, 0.5, True), None)
    finally:
        out, err = finish(proc, timeout=90)
    assert proc.returncode == 0, err[-3000:]
    assert "rank 0: " in out and "heartbeats" in out
    records = read_log_dir(logs)
    warnings = _named(records, "monitor_warning")
    assert len(warnings) == 1, warnings
    assert warnings[0]["local_rank"] == 0 and warnings[0]["pid"] == os.getpid()
    assert f"refused a connection from pid {os.getpid()}" in warnings[0]["message"]
    assert f"refused a connection from pid {os.getpid()}" in err
    assert not _named(records, "hang") and not _named(records, "failure"), json.dumps(records)[-2000:]
