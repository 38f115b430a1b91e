"""Restart scopes, the job-wide budget, exclusion with a spare. (The crash-loop back-off and a SIGKILLed
agent are cases of the fault matrix: testkit/fault_cases.py.)"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from testkit.helpers import SCRIPTS, finish, free_port, launcher_env, run_launcher

SLEEPER = str(SCRIPTS / "sleeper.py")
TRAIN = str(SCRIPTS / "train.py")
LAUNCHER = [sys.executable, "-m", "mbr_launch", "--skip-check", "all"]
pytestmark = [pytest.mark.timeout(180), pytest.mark.processes]


def _lines(path: Path) -> list[tuple[int, int, int, float]]:
    return [(int(r), int(n), int(pid), float(t)) for r, n, pid, t in
            (line.split() for line in path.read_text().splitlines())]


def _agents(n: int, nnodes: str, args: list[str], *, envs: list[dict] | None = None, port: int | None = None,
            host: int = 0):
    """n agents on localhost; agent `host` hosts the rendezvous store (is_host), as the endpoint's machine
    does on a cluster. Unpinned, whichever agent creates its handler first would host it."""
    port = port or free_port()
    procs = []
    for i in range(n):
        env = launcher_env(**(envs[i] if envs else {}))
        pin = f"is_host={1 if i == host else 0}"
        agent_args = list(args)
        if "--rdzv-conf" in agent_args:
            at = agent_args.index("--rdzv-conf") + 1
            agent_args[at] = f"{agent_args[at]},{pin}"
        else:
            agent_args = ["--rdzv-conf", pin, *agent_args]
        procs.append(subprocess.Popen([*LAUNCHER, "--nnodes", nnodes, "--rdzv-backend", "c10d", "--rdzv-endpoint",
                                       f"127.0.0.1:{port}", "--rdzv-id", f"p{port}", *agent_args],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                      start_new_session=True))
        time.sleep(0.3)
    return procs


def test_rank_scope_restarts_only_the_failed_rank(tmp_path):
    ready = tmp_path / "ready"
    res = run_launcher(["--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--restart-scope", "rank",
                        "--log-dir", str(tmp_path), SLEEPER, "--ready-file", str(ready), "--crash", "1:0",
                        "--run-seconds", "4"])
    assert res.returncode == 0, res.stderr
    lines = _lines(ready)
    assert [(r, n) for r, n, _p, _t in lines if r == 0] == [(0, 0)], "rank 0 was restarted"
    assert [(r, n) for r, n, _p, _t in lines if r == 1] == [(1, 0), (1, 1)]
    assert "--restart-scope rank" in res.stderr


def test_node_scope_restarts_only_that_node(tmp_path):
    ready = tmp_path / "ready"
    procs = _agents(2, "2", ["--nproc-per-node", "1", "--max-restarts", "1", "--restart-scope", "node",
                             SLEEPER, "--ready-file", str(ready), "--crash", "1:0", "--run-seconds", "5"])
    for proc in procs:
        _out, err = finish(proc, 120)
        assert proc.returncode == 0, err
    lines = _lines(ready)
    assert [(r, n) for r, n, _p, _t in lines if r == 0] == [(0, 0)], "the healthy node was restarted"
    assert [(r, n) for r, n, _p, _t in lines if r == 1] == [(1, 0), (1, 1)]


def test_budget_is_job_wide_across_nodes(tmp_path):
    """Round 0 fails on one node, round 1 on the other. torchrun counts restarts per agent, so each agent
    would think it has budget left; here the budget of 1 is the job's, so the second failure ends the job on
    both nodes, and both saw the same TORCHELASTIC_RESTART_COUNT."""
    ready = tmp_path / "ready"
    procs = _agents(2, "2", ["--nproc-per-node", "1", "--max-restarts", "1", SLEEPER, "--ready-file", str(ready),
                             "--crash", "0:0,1:1", "--run-seconds", "30"])
    outs = [finish(p, 150) for p in procs]
    assert [p.returncode for p in procs] == [1, 1], outs
    assert any("restart budget exhausted (1 restarts allowed)" in err for _o, err in outs), outs
    by_restart: dict[int, set[int]] = {}
    for r, n, _p, _t in _lines(ready):
        by_restart.setdefault(n, set()).add(r)
    assert by_restart == {0: {0, 1}, 1: {0, 1}}, by_restart


def test_exclusion_lets_a_spare_take_over(tmp_path):
    """2:2 with a third agent as the spare: the crashing node leaves (exit 6) and the spare takes its place.
    The crash comes 3 s into the round so that the spare is usually waiting by then; one still starting up is
    not counted, and then the crashing node stays for a restart (test_policy, test_agent_replay) and leaves
    on its next failure, once the spare waits."""
    ready = tmp_path / "ready"
    envs = [{}, {"CRASH_ME": "1"}, {}]
    procs = _agents(3, "2:2", ["--nproc-per-node", "1", "--max-restarts", "3", "--max-node-failures", "1",
                               SLEEPER, "--ready-file", str(ready), "--crash-if-env", "CRASH_ME",
                               "--crash-after", "3", "--run-seconds", "6"], envs=envs)
    outs = [finish(p, 170) for p in procs]
    codes = [p.returncode for p in procs]
    if "leaves the job" not in outs[1][1]:
        # The crashing node was the spare when the job ended (never admitted, or after staying for a restart)
        assert codes == [0, 0, 0], outs
        pytest.skip("the crashing agent was a spare when the job ended (nothing to exclude)")
    assert codes == [0, 6, 0], outs
    assert "failed 1 times" in outs[1][1] or "failed 2 times" in outs[1][1], outs[1][1]


def test_the_node_hosting_the_store_is_not_excluded(tmp_path):
    """The crashing agent hosts the rendezvous store: leaving would end every node (exit 3), so it stays and
    the job restarts until its budget is spent; nobody exits 6 or 3."""
    ready = tmp_path / "ready"
    envs = [{}, {"CRASH_ME": "1"}, {}]
    procs = _agents(3, "2:2", ["--nproc-per-node", "1", "--max-restarts", "2", "--max-node-failures", "1",
                               "--restart-backoff", "0", SLEEPER, "--ready-file", str(ready), "--crash-if-env",
                               "CRASH_ME", "--run-seconds", "3"], envs=envs, host=1)
    outs = [finish(p, 170) for p in procs]
    codes = [p.returncode for p in procs]
    if "hosts the rendezvous store" not in outs[1][1]:
        pytest.skip("the crashing agent stayed a spare in this run (nothing to exclude)")
    assert 6 not in codes and 3 not in codes, (codes, outs)
    if "while this node waited to join a round" in outs[1][1]:
        # It stayed (the point of this test: checked above), but the spare joined a restarted round before it
        # did, and that round finished without it (2:2 admits the first two; the common case since the restart
        # got faster, seen in most CI runs of 2026-12-01): it kept serving the store to the end, so all exit 0.
        assert codes == [0, 0, 0], (codes, outs)
        return
    assert codes[1] == 1 and "restart budget exhausted" in outs[1][1], outs[1][1]
