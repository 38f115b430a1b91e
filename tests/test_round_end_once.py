"""A failure's round end does each thing once (issue 30, finding 4).

* The workers are stopped once: the failure path's stop and the round's own end (``agent.loop``'s ``finally``,
  then the agent's teardown) used to stop them again, each with its /proc scans. A real ``WorkerGroup`` with
  real workers: the second stop signals nothing and reads no /proc; a rank restarted since is a new worker,
  and the next stop takes it (and signals the whole group as before).
* The ranks that crashed together are recorded from one monitor snapshot, not one per rank.
* The count of nodes waiting outside the round is read once: by the failure's facts where the policy weighs
  it (a node that would leave, a lost peer), else only when the next round's path is chosen.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from mbr_launch import api, procstat
from mbr_launch.report.events import EventLog
from mbr_launch.workers import process
from mbr_launch.workers.group import WorkerGroup

from mbr_launch.agent.messages import RankStarted
from mbr_launch.agent.lifecycle import MonitorHandle
from mbr_launch.report import exitcodes

from .replay import FakeMonitor, all_exit, build_world, exited, make_round, post

pytestmark = pytest.mark.timeout(60)


def _group(tmp_path: Path) -> WorkerGroup:
    script = tmp_path / "sleeper.py"
    script.write_text("import time\ntime.sleep(60)\n")
    environ = {"PATH": os.environ.get("PATH", "")}
    cfg = api.build_launch_config(cli={"nproc_per_node": "2", "rank_monitor": "off", "standby": "off",
                                       "log_dir": str(tmp_path / "logs")}, script=str(script), environ=environ)
    sock_dir = tmp_path / "sock"
    sock_dir.mkdir(mode=0o700)
    return WorkerGroup(cfg, environ={**environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
                                     "PYTHON": sys.executable},
                       run_dir=tmp_path / "run", sock_dir=sock_dir, log=EventLog(tmp_path / "events.jsonl", node="n0"),
                       monitor=None, say=lambda line: None)


@pytest.fixture
def counted(monkeypatch):
    """How many /proc scans and group signals each stop makes."""
    calls = {"scans": 0, "signals": []}
    scan, signal_group = procstat.scan, process.signal_group

    def counting_scan():
        calls["scans"] += 1
        return scan()

    def counting_signal(worker, sig):
        calls["signals"].append((worker.local_rank, signal.Signals(sig).name))
        signal_group(worker, sig)

    monkeypatch.setattr(procstat, "scan", counting_scan)
    monkeypatch.setattr(process, "signal_group", counting_signal)
    return calls


@pytest.mark.processes
def test_a_second_stop_of_the_round_does_nothing(tmp_path, counted):
    group = _group(tmp_path)
    rnd = make_round(0, group_rank=1, nodes=2)  # group rank 1: no workers' store is served here
    group.start(rnd)
    try:
        first = [w.pid for w in group.workers]
        group.stop(rnd, grace=5)  # the failure path's stop
        assert all(not w.alive and w.stopped for w in group.workers)
        once = counted["scans"]
        assert once == 3  # strays before the first signal, again before SIGKILL; the zombies after
        assert counted["signals"] == [(0, "SIGTERM"), (0, "SIGCONT"), (1, "SIGTERM"), (1, "SIGCONT"),
                                      (0, "SIGKILL"), (1, "SIGKILL")]
        counted["signals"].clear()
        group.stop(rnd, grace=5)  # the round's end
        group.stop(None, grace=5)  # the agent's teardown
        group.stop(rnd, local_ranks=[1], grace=5)
        assert counted["scans"] == once and counted["signals"] == []

        group.start(rnd, [0], restart_count=1)  # a rank restarted in the round: a new worker
        assert group.workers[0].pid not in first and not group.workers[0].stopped and group.workers[1].stopped
        group.stop(rnd, grace=5)  # takes the new one; the stopped one's group is signalled again, as before
        assert counted["scans"] == 2 * once
        assert counted["signals"] == [(0, "SIGTERM"), (0, "SIGCONT"), (0, "SIGKILL"), (1, "SIGKILL")]
        assert all(not w.alive and w.stopped for w in group.workers)
    finally:
        group.kill_now()
        for worker in group.workers:
            worker.proc.wait()
        group.close()


# ---- the monitor: one snapshot for every rank of a round end ------------------------------------------------


class SnapshotLink:
    def __init__(self, ranks: list[dict]) -> None:
        self.ranks, self.calls = ranks, 0

    def snapshot(self, timeout: float) -> dict:
        self.calls += 1
        return {"ev": "snapshot", "ranks": self.ranks}


def _handle(link) -> MonitorHandle:
    handle = MonitorHandle(enabled=True, sock_dir=Path("/nonexistent"), ft={}, steps=None, env={},
                           post=lambda event: None, on_link=lambda link: None)
    handle.link = link
    return handle


def test_last_sections_of_several_ranks_is_one_snapshot():
    link = SnapshotLink([{"local_rank": 0, "open_sections": ["step", "fwd"]}, {"local_rank": 1, "open_sections": []},
                         {"local_rank": 2, "open_sections": ["ckpt"]}])
    handle = _handle(link)
    assert handle.last_sections([0, 1, 3]) == {0: "step,fwd", 1: None, 3: None}
    assert link.calls == 1


def test_last_sections_without_an_answer_are_none():
    class Gone:
        def snapshot(self, timeout: float) -> dict:
            raise RuntimeError("rank monitor is gone")

    assert _handle(Gone()).last_sections([0, 1]) == {0: None, 1: None}
    handle = _handle(None)
    assert handle.last_sections([2]) == {2: None}


class SectionMonitor(FakeMonitor):
    def __init__(self, sections: dict[int, str]) -> None:
        super().__init__()
        self.sections, self.asked = sections, []

    def last_sections(self, local_ranks):
        local_ranks = list(local_ranks)
        self.asked.append(local_ranks)
        return {lr: self.sections.get(lr) for lr in local_ranks}


def _counting_spares(world) -> list[int]:
    reads = []
    real = world.rendezvous.spare_count

    def spare_count() -> int:
        reads.append(1)
        return real()

    world.rendezvous.spare_count = spare_count
    world.ctx.rendezvous = world.rendezvous
    return reads


def _crash_all(code: int):
    def step(world) -> None:
        for worker in world.group.workers:
            worker.status = exited(code)
    return step


def test_ranks_that_crash_together_are_recorded_from_one_snapshot_and_one_spare_read(tmp_path):
    world = build_world(tmp_path, ("max_restarts", 3), nproc=3)
    monitor = SectionMonitor({0: "step", 2: "ckpt,save"})
    world.ctx.monitor = monitor
    spares = _counting_spares(world)
    assert world.run([post(RankStarted(0)), _crash_all(5), all_exit(0)]) == exitcodes.OK
    failures = world.events("failure")
    assert [(f["rank"], f["node"], f["cause"], f["exit_code"], f["section"]) for f in failures] == [
        (0, "n0", "crash", 5, "step"), (1, "n0", "crash", 5, None), (2, "n0", "crash", 5, "ckpt,save")]
    assert monitor.asked == [[0, 1, 2]]
    assert len(spares) == 1  # the next round's path (loop.fast_blocker); the policy did not need it


def test_a_node_past_its_failure_limit_counts_the_spares_once(tmp_path):
    """--max-node-failures reached: a spare waiting decides whether this node may leave (it does)."""
    world = build_world(tmp_path, ("nnodes", "2:2"), ("rdzv_backend", "c10d"), ("rdzv_endpoint", "127.0.0.1:29401"),
                        ("max_restarts", 3), ("max_node_failures", 1), nodes=2, spares=1)
    spares = _counting_spares(world)
    assert world.run([_crash_all(1)]) == exitcodes.EXCLUDED
    assert len(world.events("exclude")) == 1 and len(spares) == 1
