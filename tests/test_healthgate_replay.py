"""The health gate in the real supervisor loop (tests/replay.py: fake workers, rendezvous, store and clock):
a node that fails a check before its first join never joins; one that fails before a re-join after a restart
aborts the fast path, leaves the rendezvous and exits 7; the GPU memory wait runs between rounds only."""

from __future__ import annotations

from dataclasses import replace

import pytest

from mbr_launch.agent.features import health
from mbr_launch.agent.features.health import HealthGate
from mbr_launch.agent.messages import Departure, RankStarted
from mbr_launch.config.model import NvrxLauncherSpec
from mbr_launch.health import suite
from mbr_launch.health.checks import PathStatus, ProbeReport
from mbr_launch.health.nvml import GpuMemory, GpuProcess
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
    assert health.wanted(world.ctx.cfg)
    world.ctx.features = [HealthGate(world.ctx.cfg, {}, own_pids=set, read=suite.Readers(probe_paths=probe or Paths("ok")),
                                     gpu=gpu or (lambda: "no NVML in this test"), clock=world.clock)]
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
    monkeypatch.setattr(health.fastround, "abort",
                        lambda control, reason, *, token, nodes: aborted.append((token, nodes, reason)))
    world = gated(build_world(tmp_path, ("max_restarts", 3), nodes=2), STORAGE, probe=Paths("ok", "unreadable"))
    assert world.run([post(RankStarted(0)), exit_rank(1, code=1)]) == exitcodes.UNHEALTHY
    assert world.rendezvous.joined == 1  # round 0 only
    assert world.ctx.departure is Departure.LEAVE  # the others go on without it
    assert aborted == [("t0", 2, "node n0 stays out: health check storage_paths failed: /data is unreadable")]
    assert [(e["round"], e["ok"]) for e in world.events("health_check")] == [(0, True), (1, False)]


class FakeNvml:
    """NVML at ``health.nvml``'s boundary: one scripted answer per look at the GPUs (the last one again when they
    run out); a look asks for each GPU in turn."""

    def __init__(self, *looks: list[GpuMemory]) -> None:
        self.looks = list(looks)
        self.current: dict[str, GpuMemory] = {}
        self.closed = False

    def memory(self, device: str) -> GpuMemory:
        if device not in self.current:  # asked again: a new look begins
            look = self.looks.pop(0) if len(self.looks) > 1 else self.looks[0]
            self.current = {m.device: m for m in look}
        return self.current.pop(device)

    def close(self) -> None:
        self.closed = True


def gpu(device: str, *procs: tuple[int, float], total: float = 81920.0) -> GpuMemory:
    return GpuMemory(device, 500 + sum(mb for _, mb in procs), total, tuple(GpuProcess(p, mb) for p, mb in procs))


# A pid no process can have here (above the kernel's pid_max): a stranger that NVML names and /proc does not show
# (another PID namespace); it is on the GPU before the first round, so it is not the job's.
UNSEEN = int(open("/proc/sys/kernel/pid_max").read()) + 7
W0, W1 = 5001, 5002  # the replay world's first two workers (tests/replay.py)
SPEC = NvrxLauncherSpec(gpu_memory_reclaim_timeout=50, gpu_memory_poll_interval=2)


def test_the_gpu_memory_wait_ends_when_the_stopped_workers_memory_is_back_and_names_the_stranger(tmp_path):
    nvml = FakeNvml([gpu("0", (UNSEEN, 2383)), gpu("1")],  # before the first round
                    [gpu("0", (W0, 30000), (UNSEEN, 2383)), gpu("1", (W1, 29000))],  # the stop begins
                    [gpu("0", (W0, 30000), (UNSEEN, 2383)), gpu("1")],  # the wait: rank 0's memory still there
                    [gpu("0", (UNSEEN, 2383)), gpu("1")])
    opened = []
    world = gated(build_world(tmp_path, ("max_restarts", 3)), SPEC, gpu=lambda: opened.append(1) or nvml)
    assert world.run([post(RankStarted(0)), exit_rank(1, code=1), all_exit(0)]) == exitcodes.OK
    assert opened == [1]  # opened once, at the first join, and kept: no NVML init on a stop's path
    [event] = world.events("gpu_memory")
    assert (event["round"], event["reclaimed"], event["polls"], event["short"]) == (1, True, 2, [])
    assert event["used_mb"] == {"0": 2883.0, "1": 500.0}  # over NVRx's 512 MB tolerance: ft_launcher waits on
    assert event["held_by"] == [{"gpu": "0", "pid": UNSEEN, "mb": 2383.0, "owner": "stranger", "user": "",
                                 "command": ""}]
    assert world.wakeup.sleeps[-1:] == [0.05]  # the second poll came 50 ms after the first
    [line] = [s for s in world.said if s.startswith("GPU memory")]
    assert line == (f"GPU memory of the stopped workers back after 0.05 s; not waited for: pid {UNSEEN} (not visible "
                    "from here: exited, or in another PID namespace; not of this job) holds 2383 MB on GPU 0")


def test_a_node_whose_strangers_leave_less_memory_than_its_ranks_used_stays_out(tmp_path):
    nvml = FakeNvml([gpu("0", (UNSEEN, 2383)), gpu("1")],
                    [gpu("0", (W0, 30000), (UNSEEN, 2383)), gpu("1", (W1, 29000))],
                    [gpu("0", (UNSEEN, 60000)), gpu("1")])  # the stranger grew while the round ran
    world = gated(build_world(tmp_path, ("max_restarts", 3)), SPEC, gpu=lambda: nvml)
    assert world.run([post(RankStarted(0)), exit_rank(1, code=1)]) == exitcodes.UNHEALTHY
    [event] = world.events("gpu_memory")
    assert event["short"] == [{"gpu": "0", "free_mb": 21420, "needed_mb": 30000}]
    [line] = [s for s in world.said if s.startswith("FAILURE: health check")]
    assert line.startswith("FAILURE: health check gpu_memory failed: GPU 0 has 21420 MB free for the next round, "
                           "and this job's workers used 30000 MB there in the last round; held by others: "
                           f"pid {UNSEEN} (not visible from here")
    assert line.endswith("this node does not join the rendezvous (exit 7)")


def test_the_wait_gives_up_naming_what_still_holds_the_memory(tmp_path):
    nvml = FakeNvml([gpu("0"), gpu("1")], [gpu("0", (W0, 30000)), gpu("1")])
    spec = NvrxLauncherSpec(gpu_memory_reclaim_timeout=3, gpu_memory_poll_interval=1)
    world = gated(build_world(tmp_path, ("max_restarts", 3)), spec, gpu=lambda: nvml)
    assert world.run([post(RankStarted(0)), exit_rank(1, code=1), all_exit(0)]) == exitcodes.OK
    assert (f"WARNING: GPU memory not back within 3 s (pid {W0} (this job's, ended) holds 30000 MB on GPU 0): "
            "starting the next round anyway") in world.said


def test_without_nvml_the_wait_is_skipped_and_said_once(tmp_path):
    world = gated(build_world(tmp_path, ("max_restarts", 3)), SPEC)
    assert world.run([exit_rank(0, code=1), exit_rank(0, code=1), all_exit(0)]) == exitcodes.OK
    assert [s for s in world.said if "reclaim" in s] == ["GPU memory reclaim wait skipped: no NVML in this test"]
    assert [e["skipped"] for e in world.events("gpu_memory")] == ["no NVML in this test"]
