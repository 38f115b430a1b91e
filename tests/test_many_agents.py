"""A hang among several agents of one rank each (#31's 32-agent benchmark, scaled down for CI): the rank of the
agent that hosts the rendezvous store is SIGSTOPped between two steps while every other rank waits for it in an
all_reduce. Every agent must name it, the job must restart and every agent must exit 0.
(benchmarks/bench_scale_hang.py runs 32 agents through 30 such hangs.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testkit.eventlog import read_log_dir
from testkit.fault_runs import descendants
from testkit.helpers import SCRIPTS, free_port, launcher_env

pytestmark = [pytest.mark.processes, pytest.mark.timeout(300)]

WORKER = SCRIPTS / "many_agents_worker.py"
AGENTS = 4


def _lines(path: Path, word: str, generation: int) -> dict[int, int]:
    """rank -> pid of the worker's ``word <rank> <generation> <time> <pid>`` lines."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 5 and parts[0] == word and int(parts[2]) == generation:
            out[int(parts[1])] = int(parts[4])
    return out


def test_a_stopped_rank_on_the_store_host_is_named_by_every_agent_and_the_job_restarts(tmp_path):
    port, ready, gen = free_port(), tmp_path / "ready", tmp_path / "generation"
    gen.write_text("0")
    (tmp_path / "sleep").mkdir()
    procs: list[subprocess.Popen] = []
    try:
        for i in range(AGENTS):
            cmd = [sys.executable, "-m", "mbr_launch", "--nnodes", str(AGENTS), "--nproc-per-node", "1",
                   "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"many{port}",
                   "--max-restarts", "1", "--step-timeout", "6", "--standby", "off", "--skip-check", "all",
                   "--status", "off", "--log-dir", str(tmp_path / f"agent{i}"), str(WORKER),
                   "--ready-file", str(ready), "--gen-file", str(gen), "--sleep-dir", str(tmp_path / "sleep")]
            procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                          env=launcher_env(), start_new_session=True))
            if i == 0:
                time.sleep(0.5)  # agent 0 binds the store's port: it hosts the store
        end = time.monotonic() + 200
        while len(_lines(ready, "ready", 0)) < AGENTS:
            assert time.monotonic() < end and all(p.poll() is None for p in procs), "round 0 did not start"
            time.sleep(0.1)
        up = _lines(ready, "ready", 0)
        host_tree = descendants(procs[0].pid)
        [victim] = [rank for rank, pid in up.items() if pid in host_tree]
        gen.write_text("1")  # the next round's workers make a few steps and exit 0
        os.kill(up[victim], signal.SIGSTOP)
        errs = [p.communicate(timeout=max(1.0, end - time.monotonic()))[1] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    assert [p.returncode for p in procs] == [0] * AGENTS, "\n".join(e[-2000:] for e in errs)
    assert len(_lines(ready, "ready", 1)) == AGENTS  # restarted
    # the store host's group rank: torch orders the nodes by their descriptors, not by who bound the store
    host = next(e["group_rank"] for e in read_log_dir(tmp_path / "agent0") if e["event"] == "rendezvous")
    for i in range(AGENTS):
        verdicts = [e for e in read_log_dir(tmp_path / f"agent{i}") if e["event"] == "verdict"]
        assert verdicts, f"agent {i}: no verdict"
        v = verdicts[0]
        assert v["culprits"] == [victim] and v["group_ranks"] == [host], (i, v)
        assert sorted(v["waiting"]) == sorted(set(range(AGENTS)) - {victim}), (i, v)
        assert f"HANG: rank {victim} " in errs[i], (i, errs[i][-2000:])
