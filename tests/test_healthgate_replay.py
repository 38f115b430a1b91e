"""The health gate in the real supervisor loop (tests/replay.py: fake workers, rendezvous, store and clock):
a node that fails a check before its first join never joins; one that fails before a re-join after a restart
aborts the fast path, leaves the rendezvous and exits 7; the GPU memory wait runs between rounds only."""

from __future__ import annotations

from dataclasses import replace

import pytest

from mbr_launch.agent import healthgate
from mbr_launch.agent.healthgate import HealthGate
from mbr_launch.agent.messages import Departure, RankStarted
from mbr_launch.config.model import NvrxLauncherSpec
from mbr_launch.health import suite
from mbr_launch.health.checks import PathStatus, ProbeReport
from mbr_launch.health.gpumem import Sample
from mbr_launch.report import exitcodes
from tests.replay import all_exit, build_world, exit_rank, post

pytestmark = pytest.mark.timeout(20)


class Paths:
    """A storage probe whose answers the test scripts, one report per call (the last one again)."""

    def __init__(self, *statuses: str) -> None:
        self.statuses = list(statuses)
        self.calls = 0

    def __call__(self, mode: str, paths):
        self.calls += 1
        status = self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]
        return ProbeReport(tuple(PathStatus(p, status) for p in paths))


def gated(world, spec: NvrxLauncherSpec, *, probe=None, gpu=None):
    world.ctx.cfg = replace(world.ctx.cfg, nvrx=spec)
    assert healthgate.wanted(world.ctx.cfg)
    world.ctx.health = HealthGate(world.ctx.cfg, {}, own_pids=set, read=suite.Readers(probe_paths=probe or Paths("ok")),
                                  gpu=gpu or (lambda devices: "no NVML in this test"), clock=world.clock)
    return world


STORAGE = NvrxLauncherSpec(storage_healthcheck_paths=("/data",))


def test_a_node_that_fails_before_its_first_join_never_joins(tmp_path):
    world = gated(build_world(tmp_path), STORAGE, probe=Paths("missing"))
    assert world.run([]) == exitcodes.UNHEALTHY
    assert world.rendezvous.joined == 0 and world.group.starts == []
    assert world.ctx.departure is Departure.NONE
    [line] = [s for s in world.said if s.startswith("FAILURE")]
    assert line == ("FAILURE: health check storage_paths failed: /data is missing; this node does not join the "
                    "rendezvous (exit 7)")
    [check] = world.events("health_check")
    assert (check["round"], check["ok"], check["failed"], check["detail"]) == (0, False, "storage_paths", "/data is missing")
    assert world.events("end")[-1]["exit_code"] == exitcodes.UNHEALTHY


def test_a_node_that_fails_before_a_rejoin_leaves_and_tells_the_others(tmp_path, monkeypatch):
    aborted = []
    monkeypatch.setattr(healthgate.fastround, "abort",
                        lambda control, reason, *, token, nodes: aborted.append((token, nodes, reason)))
    world = gated(build_world(tmp_path, ("max_restarts", 3), nodes=2), STORAGE, probe=Paths("ok", "unreadable"))
    assert world.run([post(RankStarted(0)), exit_rank(1, code=1)]) == exitcodes.UNHEALTHY
    assert world.rendezvous.joined == 1  # round 0 only
    assert world.ctx.departure is Departure.LEAVE  # the others go on without it
    assert aborted == [("t0", 2, "node n0 stays out: health check storage_paths failed: /data is unreadable")]
    assert [(e["round"], e["ok"]) for e in world.events("health_check")] == [(0, True), (1, False)]


def test_the_gpu_memory_wait_runs_between_rounds_and_a_missing_nvml_is_said_once(tmp_path):
    polls = [[Sample("0", 9000.0), Sample("1", 100.0)], [Sample("0", 300.0), Sample("1", 100.0)]]

    class Reader:
        closed = False

        def __call__(self):
            return polls.pop(0) if len(polls) > 1 else polls[0]

        def close(self):
            Reader.closed = True

    opened: list[list[str]] = []
    spec = NvrxLauncherSpec(gpu_memory_reclaim_timeout=50, gpu_memory_poll_interval=2)
    world = gated(build_world(tmp_path, ("max_restarts", 3)), spec, gpu=lambda d: opened.append(d) or Reader())
    assert world.run([post(RankStarted(0)), exit_rank(1, code=1), all_exit(0)]) == exitcodes.OK
    assert opened == [["0", "1"]] and Reader.closed  # once: before the restart, not before the first round
    [event] = world.events("gpu_memory")
    assert (event["round"], event["reclaimed"], event["polls"], event["used_mb"]) == (1, True, 2, {"0": 300.0, "1": 100.0})
    assert 2.0 in world.wakeup.sleeps  # the poll's pause went through the loop's interruptible sleep
    assert any(s.startswith("GPU memory back after 2.0 s") for s in world.said)

    (tmp_path / "b").mkdir()
    world = gated(build_world(tmp_path / "b", ("max_restarts", 3)), spec)
    assert world.run([exit_rank(0, code=1), exit_rank(0, code=1), all_exit(0)]) == exitcodes.OK
    assert [s for s in world.said if "reclaim" in s] == ["GPU memory reclaim wait skipped: no NVML in this test"]
    assert [e["skipped"] for e in world.events("gpu_memory")] == ["no NVML in this test"]
