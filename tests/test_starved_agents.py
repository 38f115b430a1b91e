"""Issue #38: silence on a loaded machine. Agents of one rank each, all started at once, a gloo job stepping:

- the agent every other one watches (group rank 0) and the store's host get no turn for any thread (one of
  their threads holds the GIL: tests/scripts/gil_hog) for several times ``--peer-timeout``: alive and running,
  they must not be taken for dead or cut off (nor may they take the others so); the job goes on and every
  agent exits 0. (A CPU hog beside them does not starve a process that needs little CPU enough: the
  scheduler serves a waking thread within a fraction of a second);
- an agent that is stopped (SIGSTOP) for longer than the timeout is still found: a peer_lost event names its
  group rank (seen on this machine as state T, it counts as silent).

(An agent SIGKILLed is testkit/fault_cases.py's ``agent_sigkill``; the store's host killed, ``store_host_lost``.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testkit.eventlog import read_log_dir
from testkit.helpers import SCRIPTS, free_port, launcher_env, listener

pytestmark = [pytest.mark.processes, pytest.mark.timeout(420)]

WORKER = SCRIPTS / "until_told_worker.py"
AGENTS = 6
PEER_TIMEOUT = 3.0
HOG_PATH = SCRIPTS / "gil_hog"  # its sitecustomize starves the process a file names of the GIL


def _ready(path: Path) -> dict[int, int]:
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return {}
    return {int(p[1]): int(p[2]) for p in (line.split() for line in lines) if len(p) == 3 and p[0] == "ready"}


def _agent(i: int, port: int, tmp: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "mbr_launch", "--nnodes", str(AGENTS), "--nproc-per-node", "1",
           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"starved{port}",
           "--peer-timeout", str(PEER_TIMEOUT), "--max-restarts", "0", "--standby", "off", "--skip-check", "all",
           "--status", "off", "--log-dir", str(tmp / f"agent{i}"), str(WORKER), "--ready-file", str(tmp / "ready"),
           "--finish-file", str(tmp / "finish")]
    env = launcher_env(MBR_TEST_GIL_HOG=str(tmp / "hog"))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HOG_PATH), env.get("PYTHONPATH", "")) if p)
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)


def _start(tmp: Path) -> tuple[int, list[subprocess.Popen]]:
    port = free_port()
    procs = [_agent(i, port, tmp) for i in range(AGENTS)]  # all at once: none waits for the store's host
    end = time.monotonic() + 240
    while len(_ready(tmp / "ready")) < AGENTS:
        assert time.monotonic() < end and all(p.poll() is None for p in procs), "the job did not start"
        time.sleep(0.1)
    return port, procs


def _end(procs: list[subprocess.Popen], *more: subprocess.Popen) -> None:
    for p in [*procs, *more]:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGCONT)
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def _group_rank(tmp: Path, i: int) -> int:
    return next(e["group_rank"] for e in read_log_dir(tmp / f"agent{i}") if e["event"] == "rendezvous")


def _events(tmp: Path, kind: str) -> list[tuple[int, dict]]:
    return [(i, e) for i in range(AGENTS) for e in read_log_dir(tmp / f"agent{i}") if e["event"] == kind]


def test_starved_agents_are_not_taken_for_dead_and_the_job_goes_on(tmp_path):
    procs: list[subprocess.Popen] = []
    try:
        port, procs = _start(tmp_path)
        host = listener(port, [p.pid for p in procs])
        assert host is not None, "no agent listens on the store's port"
        first = next(p.pid for i, p in enumerate(procs) if _group_rank(tmp_path, i) == 0)
        # the agent every other one watches, and the store's host: no turn for any of their threads
        (tmp_path / "hog").write_text(f"{5 * PEER_TIMEOUT} {first} {host}")
        time.sleep(5 * PEER_TIMEOUT + 2)
        assert all(p.poll() is None for p in procs), [p.returncode for p in procs]
        (tmp_path / "finish").touch()
        errs = [p.communicate(timeout=180)[1] for p in procs]
    finally:
        _end(procs)
    assert [p.returncode for p in procs] == [0] * AGENTS, "\n".join(e[-1500:] for e in errs)
    assert _events(tmp_path, "peer_lost") == []


def test_an_agent_stopped_past_the_timeout_is_still_found(tmp_path):
    procs: list[subprocess.Popen] = []
    try:
        port, procs = _start(tmp_path)
        host = listener(port, [p.pid for p in procs])
        ranks = {i: _group_rank(tmp_path, i) for i in range(AGENTS)}
        # not the store's host (that is store_host_lost's case) and not group rank 0, which watches the others
        victim = next(i for i in range(AGENTS) if procs[i].pid != host and ranks[i] != 0)
        os.kill(procs[victim].pid, signal.SIGSTOP)
        watcher = next(i for i in range(AGENTS) if ranks[i] == 0)
        end = time.monotonic() + 120
        while not any(i == watcher for i, _ in _events(tmp_path, "peer_lost")):
            assert time.monotonic() < end, "the stopped agent was never found"
            time.sleep(0.2)
        os.kill(procs[victim].pid, signal.SIGCONT)
        for p in procs:
            try:
                p.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                pass
    finally:
        _end(procs)
    lost = [e for i, e in _events(tmp_path, "peer_lost") if i == watcher]
    assert lost[0]["kind"] == "peer_lost" and f"group rank {ranks[victim]} " in lost[0]["detail"], lost
