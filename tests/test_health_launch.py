"""Real launches: pre-rendezvous health checks with three agents on this machine (one never joins, one stays
out at the restart, the last goes on alone), and, on one agent, the leftover-process check, the GPU memory
wait without NVML and NUMA binding with NVRX_GPUS_PER_NUMA set."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from testkit.eventlog import read_log_dir

from testkit.helpers import SCRIPTS, finish, free_port, launcher_env, run_events, run_launcher, start_launcher

WORKER = str(SCRIPTS / "health_worker.py")
pytestmark = [pytest.mark.timeout(150), pytest.mark.processes]


def _listening(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise AssertionError(f"nobody listens on {port} after {timeout} s")


def test_nodes_that_fail_a_check_stay_out_and_the_others_go_on(tmp_path):
    port = free_port()
    mine = {name: tmp_path / f"storage_{name}" for name in "abc"}
    mine["a"].mkdir()
    mine["b"].write_text("present until rank 0 removes it\n")  # c's is never there
    out = tmp_path / "out"
    out.mkdir()

    def agent(name: str) -> subprocess.Popen:
        return start_launcher(["--nnodes", "1:2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                               "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"health{port}",
                               "--max-restarts", "2", "--log-dir", str(tmp_path / f"logs_{name}"),
                               "--ft-storage-health-check-path", str(mine[name]),
                               WORKER, str(out), "--remove", str(mine["b"])])

    # a first, so that it serves the rendezvous store (b's exit must not take it away); c, which never gets
    # as far as the store, with it
    a, c = agent("a"), agent("c")
    try:
        _listening(port, 60)
    except AssertionError:
        for proc in (a, c):
            os.killpg(proc.pid, signal.SIGKILL)
        raise
    b = agent("b")
    (_, err_c), (_, err_b), (_, err_a) = finish(c, 60), finish(b, 120), finish(a, 120)
    assert (a.returncode, b.returncode, c.returncode) == (0, 7, 7), (err_a[-3000:], err_b[-3000:], err_c[-3000:])

    # c: one line saying which check failed and why; it never joined
    assert (f"FAILURE: health check storage_paths failed: {mine['c']} is missing; this node does not join the "
            "rendezvous (exit 7)") in err_c
    events_c = run_events(tmp_path / "logs_c")
    assert [e["event"] for e in events_c if e["event"] in ("health_check", "rendezvous", "worker_start")] == ["health_check"]
    # b: joined round 0, failed its check before the re-join after rank 0's failure, and left
    assert f"FAILURE: health check storage_paths failed: {mine['b']} is missing" in err_b
    events_b = run_events(tmp_path / "logs_b")
    assert [(e["round"], e["ok"]) for e in events_b if e["event"] == "health_check"] == [(0, True), (1, False)]
    assert [e["round"] for e in events_b if e["event"] == "rendezvous"] == [0]
    # a: round 0 with b, round 1 alone (the fast path aborted by b, which had left)
    events_a = run_events(tmp_path / "logs_a")
    rounds = [e for e in events_a if e["event"] == "rendezvous"]
    assert [(e["round"], e["group_world_size"]) for e in rounds] == [(0, 2), (1, 1)], rounds
    assert "stays out" in rounds[1].get("fallback", ""), rounds[1]
    assert [(e["round"], e["ok"]) for e in events_a if e["event"] == "health_check"] == [(0, True), (1, True)]
    assert (out / "done.0").read_text().split()[:2] == ["0", "1"]


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_leftovers_gpu_wait_and_numa_on_one_agent(tmp_path):
    out, logs = tmp_path / "out", tmp_path / "logs"
    out.mkdir()
    env = launcher_env(NVRX_GPUS_PER_NUMA="1")
    try:
        res = run_launcher(["--standalone", "--nproc-per-node", "1", "--max-restarts", "1", "--log-dir", str(logs),
                            "--ft-check-remaining-processes", "true", "--ft-gpu-memory-reclaim-timeout", "5",
                            WORKER, str(out), "--leave-child"], env=env, timeout=90)
        child = int((out / "child").read_text())
        assert res.returncode == 0, res.stderr[-3000:]
        records = read_log_dir(logs)
        [found] = [r for r in records if r["event"] == "leftovers"]
        [process] = found["processes"]
        assert (found["round"], process["pid"]) == (0, child), found
        assert process["cmdline"] == "sleep 60" and "adopted by the launcher" in process["why"]
        assert f"WARNING: 1 process of round 0 still alive after its workers were stopped: pid {child} `sleep 60`" \
            in res.stderr
        assert _alive(child)  # reported, not killed (as NVRx)
    finally:
        if (out / "child").exists() and _alive(pid := int((out / "child").read_text())):
            os.kill(pid, signal.SIGKILL)
    # No NVML on this machine: the wait is skipped, once, with the reason (on a GPU machine it runs)
    gpu = [r for r in records if r["event"] == "gpu_memory"]
    if gpu and gpu[0]["skipped"]:
        assert "GPU memory reclaim wait skipped: " in res.stderr
    else:
        assert gpu and gpu[0]["reclaimed"] is not None
    # NVRX_GPUS_PER_NUMA=1 puts local rank 0 on node 0: bound through numactl, or one line saying why not
    done = (out / "done.0").read_text().split()
    if "NUMA binding (NVRX_GPUS_PER_NUMA=1" in res.stderr:
        node0 = Path("/sys/devices/system/node/node0/cpulist").read_text().strip()
        assert done[2] == ",".join(str(c) for c in sorted(_cpus(node0)))
        assert done[3] in ("2", "?")  # MPOL_BIND: --membind (the restarted rank came from a warm standby)
    else:
        assert "WARNING: NVRX_GPUS_PER_NUMA='1' asks for NUMA binding, but numactl is not installed" in res.stderr


def _cpus(cpulist: str) -> set[int]:
    cpus: set[int] = set()
    for part in cpulist.split(","):
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus
