"""Descendants that leave the worker's session (setsid) and ignore SIGTERM: the agent, their subreaper, finds
and kills them at every stop, and a pipe they hold never holds a stop (issue 16, finding 6)."""

from __future__ import annotations

from pathlib import Path

import pytest

from testkit.eventlog import read_log_dir

from testkit.helpers import SCRIPTS, run_launcher

pytestmark = [pytest.mark.timeout(120), pytest.mark.processes]


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_setsid_children_ignoring_sigterm_die_at_each_stop_without_holding_it(tmp_path):
    children, logs = tmp_path / "children", tmp_path / "logs"
    children.mkdir()
    res = run_launcher(["--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--log-dir", str(logs),
                        str(SCRIPTS / "stray_child.py"), str(children)], timeout=90)
    assert res.returncode == 0, res.stderr[-3000:]
    pids = {path.name: int(path.read_text()) for path in children.iterdir()}
    assert sorted(pids) == ["child.0.0", "child.0.1", "child.1.0", "child.1.1"]
    assert [name for name, pid in pids.items() if _alive(pid)] == []
    records = read_log_dir(logs)
    failure = next(r for r in records if r["event"] == "failure")
    exits = {rnd: [r["t"] for r in records if r["event"] == "worker_exit" and r["round"] == rnd] for rnd in (0, 1)}
    end = next(r for r in records if r["event"] == "end")
    assert end["exit_code"] == 0
    # Each stop used to wait 2 s per rank for the pipe the child holds (4 s here); now a stray gets a short
    # grace after SIGTERM, then SIGKILL.
    crash_stop = max(exits[0]) - failure["t"]
    final_stop = end["t"] - max(exits[1])
    assert crash_stop < 2.0 and final_stop < 2.0, (crash_stop, final_stop)
    assert "did not stop" not in res.stderr


def test_a_rank_restart_kills_only_that_ranks_strays(tmp_path):
    children, logs = tmp_path / "children", tmp_path / "logs"
    children.mkdir()
    res = run_launcher(["--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--restart-scope", "rank",
                        "--log-dir", str(logs), str(SCRIPTS / "stray_child.py"), str(children), "rank-scope"],
                       timeout=90)
    assert res.returncode == 0, res.stderr[-3000:]
    # When rank 0 came back, its first child was gone; rank 1's, orphaned while rank 1 ran, was not touched.
    assert (children / "scope").read_text() == "rank0-first-child-alive=False own-child-alive=True"
    pids = {path.name: int(path.read_text()) for path in children.glob("child.*")}
    assert sorted(pids) == ["child.0.0", "child.0.1", "child.1.0"]
    assert [name for name, pid in pids.items() if _alive(pid)] == []  # the final stop took the rest
