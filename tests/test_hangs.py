"""Hang detection end to end: the real NVRx RankMonitorClient in real workers under mbr-launch."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest


from testkit.helpers import SCRIPTS, run_events, run_launcher

FT_WORKER = str(SCRIPTS / "ft_worker.py")
pytestmark = [pytest.mark.timeout(150), pytest.mark.processes]
TIMEOUT = 1.5
SLACK = 0.5  # detection must land within timeout + 0.5 s on this 2-core machine

# kind -> (timeout flags, stack method)
CASES = {
    "heartbeat": (["--heartbeat-timeout", str(TIMEOUT), "--section-timeouts", "step:none"], "py-spy"),
    "section": (["--heartbeat-timeout", "60", "--section-timeouts", f"step:{TIMEOUT}"], "faulthandler"),
    "oos": (["--heartbeat-timeout", "60", "--section-timeouts", "step:none", "--out-of-section-timeout",
             str(TIMEOUT)], "py-spy"),
}
# The SIGSTOP and GIL-holding busy-loop hangs, and a killed rank monitor, are cases of the fault matrix
# (testkit/fault_cases.py: worker_sigstop, worker_busy_gil, monitor_killed), with the same assertions.
EXPECTED_KIND = {"heartbeat": "heartbeat", "section": "section", "oos": "out_of_section"}


@pytest.mark.parametrize("hang", list(CASES))
def test_hang_is_detected_dumped_and_restarted(tmp_path, hang):
    flags, method = CASES[hang]
    ready = tmp_path / "ready"
    res = run_launcher(["--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--log-dir", str(tmp_path),
                        "--stack-dump", method, "--hang-kill-grace", "1", *flags, FT_WORKER, "--hang", hang,
                        # rank 0 steps on through the verdict: on a loaded machine, a rank 0 that had finished
                        # could still be exiting when its stack was taken (no frames: no evidence from it)
                        "--hang-attempt-steps", "400", "--hang-when-ready", "2", "--ready-file", str(ready)],
                       timeout=120)
    assert res.returncode == 0, res.stderr
    events = run_events(tmp_path)
    hangs = [e for e in events if e["event"] == "hang"]
    assert len(hangs) == 1, hangs
    h = hangs[0]
    assert (h["rank"], h["kind"]) == (1, EXPECTED_KIND[hang])
    if hang == "section":
        assert h["section"] == "step"
    # detection latency past the timeout, as the monitor measured it ...
    assert TIMEOUT <= h["elapsed"] <= TIMEOUT + SLACK, h
    # ... and from the worker's own clock: it printed when it started hanging
    started = float(re.search(rf"rank 1 hanging: {hang} at ([0-9.]+)", res.stdout).group(1))
    detected = _wall(h["ts"])
    assert detected - started <= TIMEOUT + SLACK + 0.1, (detected - started)
    # stacks of every local rank, by the requested method, naming the hung function
    stacks = [e for e in events if e["event"] == "stacks"]
    assert stacks and method in stacks[0]["method"], stacks  # rank 0 may have finished meanwhile ("none")
    hung_dump = Path(next(p for p in stacks[0]["paths"] if p and p.endswith("rank1.txt"))).read_text()
    assert f"# method: {method}" in hung_dump and "hang_now" in hung_dump
    assert "stacks:" in res.stderr and "hang_now" in res.stderr  # summarised in the failure summary
    # the group restarted and finished
    restarts = sorted(tuple(map(int, line.split()[:2])) for line in ready.read_text().splitlines())
    assert restarts == [(0, 0), (0, 1), (1, 0), (1, 1)]


def _wall(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso).timestamp()


def test_calculated_timeouts_survive_a_restart(tmp_path):
    """Attempt 0 calculates section timeouts and saves state_dict(); attempt 1 loads it and hangs in 'step':
    the hang is caught by the calculated timeout, not the configured 60 s."""
    state = tmp_path / "ft_state.json"
    res = run_launcher(["--standalone", "--nproc-per-node", "2", "--max-restarts", "2", "--log-dir", str(tmp_path),
                        "--no-restart-exit-codes", "17", "--heartbeat-timeout", "60", "--ft-safety-factor", "20",
                        "--section-timeouts", "step:60", "--out-of-section-timeout", "60", "--stack-dump", "off",
                        FT_WORKER, "--state", str(state), "--steps", "20", "--hang", "section",
                        "--hang-restart", "1"], timeout=140)
    assert res.returncode == 0, res.stderr
    saved = json.loads(state.read_text())["current_timeouts"]["section"]["section"]["step"]
    assert saved < 60
    hangs = [e for e in run_events(tmp_path) if e["event"] == "hang"]
    assert len(hangs) == 1 and hangs[0]["section"] == "step"
    assert hangs[0]["timeout"] == pytest.approx(saved), (hangs[0], saved)
    assert hangs[0]["elapsed"] <= saved + SLACK
