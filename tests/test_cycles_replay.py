"""Progress tracking and cycle-info files through the real supervisor loop, failure path and policy, with fake
workers, rendezvous and store (tests/replay.py) and an in-memory job store: no process, milliseconds each."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from mbr_launch.cluster.jobstore import JobStore
from mbr_launch.cluster.storevalue import Sealer
from mbr_launch.agent.features.cycles import CycleRecords, read_iteration_file
from mbr_launch.agent.features.cycles import CycleFeature
from mbr_launch.agent.messages import Progress, RankStarted
from mbr_launch.config.model import NvrxLauncherSpec
from mbr_launch.report import exitcodes
from tests.replay import all_exit, build_world, exit_rank, make_round, post

pytestmark = pytest.mark.timeout(20)


class MemoryStore:
    """What the job store does for these keys: check, get, set, compare_set (torch's semantics)."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def check(self, keys: list[str]) -> bool:
        return all(k in self.data for k in keys)

    def get(self, key: str) -> bytes:
        return self.data[key]

    def set(self, key: str, value: str | bytes) -> None:
        self.data[key] = _bytes(value)

    def compare_set(self, key: str, expected: str | bytes, desired: str | bytes) -> bytes:
        current = self.data.get(key)
        if (current is None and _bytes(expected) == b"") or current == _bytes(expected):
            self.data[key] = _bytes(desired)
        return self.data[key] if key in self.data else _bytes(expected)


def _bytes(value: str | bytes) -> bytes:
    return value if isinstance(value, bytes) else value.encode()


def world_with_cycles(tmp_path: Path, *cli: tuple[str, Any], store: MemoryStore | None = None, **nvrx: Any):
    tmp_path.mkdir(parents=True, exist_ok=True)
    world = build_world(tmp_path, *cli)
    ctx = world.ctx
    ctx.cfg = dataclasses.replace(ctx.cfg, nvrx=NvrxLauncherSpec(**nvrx))
    store = store or MemoryStore()
    records = CycleRecords(ctx.cfg, log=ctx.log, say=ctx.say, node="n0", environ={"SLURM_JOB_ID": "42"},
                           job_store=lambda rnd: JobStore(store, None, Sealer()), hosts_store=lambda rnd: True,
                           members=lambda: ([("n0", 0)], []))
    records.start()
    ctx.features = [CycleFeature(records, status_rows=False)]
    world.rendezvous.job_get = lambda key: store.data.get(key)  # type: ignore[attr-defined]
    return world, store


def cycles(world: Any) -> CycleRecords:
    """The progress tracking records of a world made by ``world_with_cycles``."""
    [feature] = world.ctx.features
    return feature.records


def test_cycles_without_progress_end_the_job_with_the_no_restart_code(tmp_path):
    ckpt = tmp_path / "latest_checkpointed_iteration.txt"
    ckpt.write_text("100\n")
    world, store = world_with_cycles(tmp_path, ("max_restarts", 5), max_no_progress_cycles=3,
                                     checkpoint_iteration_file=str(ckpt))
    code = world.run([post(RankStarted(0)), exit_rank(1, code=1)] * 3)
    assert code == 93
    assert world.rendezvous.joined == 3  # cycles 0, 1 and 2; no cycle 3
    progress = world.events("cycle_progress")
    assert [(e["cycle"], e["source"], e["start"], e["end"], e["progress"], e["no_progress_cycles"], e["stop"])
            for e in progress] == [(0, "checkpoint_file", 100, 100, False, 1, False),
                                   (1, "checkpoint_file", 100, 100, False, 2, False),
                                   (2, "checkpoint_file", 100, 100, False, 3, True)]
    final = world.cluster.published[-1]
    assert final.final and final.exit_code == 93
    end = world.events("end")[-1]
    assert end["exit_code"] == 93
    assert end["reason"].startswith("no progress in 3 cycles in a row (cycle 0: checkpoint iteration 100 -> 100; ")
    assert "cycle 1: checkpoint iteration 100 -> 100: no progress, 2 of 3 cycles in a row" in world.said
    assert f"Result: {end['reason']} (exit code 93)" in world.ctx.summary.render()
    assert json.loads(store.data["nvrx/no_restart"])["exit_code"] == 93


def test_progress_resets_the_count_and_a_custom_code(tmp_path):
    ckpt = tmp_path / "iter"
    ckpt.write_text("100")
    world, _ = world_with_cycles(tmp_path, ("max_restarts", 5), max_no_progress_cycles=2,
                                 checkpoint_iteration_file=str(ckpt), no_restart_exit_code=17)

    def checkpoint(value: str):
        return lambda w: ckpt.write_text(value)

    code = world.run([exit_rank(0, 1),  # cycle 0: 100 -> 100
                      checkpoint("160"), exit_rank(0, 1),  # cycle 1: 100 -> 160, progress
                      exit_rank(0, 1),  # cycle 2: 160 -> 160
                      exit_rank(0, 1)])  # cycle 3: 160 -> 160: the second in a row
    assert code == 17
    assert [e["no_progress_cycles"] for e in world.events("cycle_progress")] == [1, 0, 1, 2]
    assert "(cycle 2: checkpoint iteration 160 -> 160; cycle 3: checkpoint iteration 160 -> 160; " \
        in world.events("end")[-1]["reason"]


def test_steps_and_iterations_from_the_rank_monitor(tmp_path):
    world, _ = world_with_cycles(tmp_path, ("max_restarts", 5), max_no_progress_cycles=2, min_progress_iterations=3)
    status = {"ev": "status", "ranks": [{"local_rank": 0, "steps": 4, "iteration": None},
                                        {"local_rank": 1, "steps": 1, "iteration": None}]}
    code = world.run([exit_rank(0, 1),  # cycle 0: no step ever seen: not scored
                      post(Progress("status", status)), exit_rank(0, 1),  # cycle 1: 4 steps: progress
                      exit_rank(0, 1),  # cycle 2: no step: no progress
                      post(Progress("steps", {"ranks": [{"steps": 2}]})), exit_rank(0, 1)])  # cycle 3: 2 < 3
    assert code == 93
    assert [(e["source"], e["end"], e["progress"]) for e in world.events("cycle_progress")] == [
        (None, None, None), ("steps", 4, True), ("steps", 0, False), ("steps", 2, False)]


def test_a_spent_budget_with_no_progress_ends_with_the_no_restart_code(tmp_path):
    """As ft_launcher: the progress check comes before the restart budget."""
    ckpt = tmp_path / "iter"
    ckpt.write_text("5")
    world, _ = world_with_cycles(tmp_path, ("max_restarts", 1), max_no_progress_cycles=2,
                                 checkpoint_iteration_file=str(ckpt))
    assert world.run([exit_rank(0, 1), exit_rank(0, 1)]) == 93


def test_a_spent_budget_with_progress_ends_as_before(tmp_path):
    world, _ = world_with_cycles(tmp_path, ("max_restarts", 0), max_no_progress_cycles=2)
    assert world.run([exit_rank(0, 1)]) == exitcodes.FAILED
    assert "restart budget exhausted" in world.events("end")[-1]["reason"]


def test_no_restart_exit_codes_and_success_are_left_alone(tmp_path):
    ckpt = tmp_path / "iter"
    ckpt.write_text("5")
    world, _ = world_with_cycles(tmp_path, ("max_restarts", 3), max_no_progress_cycles=1,
                                 checkpoint_iteration_file=str(ckpt))
    assert world.run([exit_rank(0, 2)]) == exitcodes.FAILED  # exit code 2 is never restarted: no cycle scored
    assert world.events("cycle_progress") == []
    world, _ = world_with_cycles(tmp_path, ("max_restarts", 3), max_no_progress_cycles=1,
                                 checkpoint_iteration_file=str(ckpt))
    assert world.run([all_exit(0)]) == exitcodes.OK


def test_two_nodes_scoring_one_round_act_on_the_first_verdict(tmp_path):
    """Both nodes' ranks failed at once; the second scorer sees other facts but adopts the claimed verdict."""
    store = MemoryStore()
    ckpt = tmp_path / "iter"
    ckpt.write_text("100")
    a, _ = world_with_cycles(tmp_path / "a", store=store, max_no_progress_cycles=1, checkpoint_iteration_file=str(ckpt))
    rnd = make_round(0)
    assert cycles(a).check(rnd) is not None  # 100 -> 100: stop
    ckpt.write_text("900")  # what the second node reads a moment later
    b, _ = world_with_cycles(tmp_path / "b", store=store, max_no_progress_cycles=1, checkpoint_iteration_file=str(ckpt))
    cycles(b)._launch_iteration = 100
    assert cycles(b).check(rnd) is not None  # it read 900, but the round's verdict is a's
    ours, theirs = a.events("cycle_progress")[0], b.events("cycle_progress")[0]
    assert (ours["claimed"], theirs["claimed"]) == (True, False)
    assert (theirs["end"], theirs["stop"]) == (100, True)


def test_a_spare_learns_why_the_job_ended(tmp_path):
    store = MemoryStore()
    store.set("nvrx/no_restart", json.dumps({"exit_code": 93, "reason": "no progress in 3 cycles in a row (...)"}))
    world, _ = world_with_cycles(tmp_path, store=store, max_no_progress_cycles=3)
    assert cycles(world).no_restart_line(lambda key: store.data.get(key)) == (93, "no progress in 3 cycles in a "
                                                                                  "row (...)")
    assert cycles(world).no_restart_line(lambda key: None) is None


def test_cycle_info_files_follow_the_rounds(tmp_path):
    world, _ = world_with_cycles(tmp_path, ("max_restarts", 2), cycle_info_dir=str(tmp_path / "nvrx"),
                                 per_cycle_applog_prefix=str(tmp_path / "app.log"))
    assert world.run([exit_rank(0, 1), all_exit(0)]) == exitcodes.OK
    cycles(world).close()
    folder = tmp_path / "nvrx"
    records = [json.loads((folder / f"cycle_info.42.0.{c}").read_text()) for c in (0, 1)]
    assert [(r["cycle_number"], r["generation"], bool(r["cycle_end_time"]), r["active_nodes"], r["active_ranks"],
             r["cycle_log_file"]) for r in records] == [
        (0, "1", True, "n[0]", "0", str(tmp_path / "app_cycle0.log")),
        (1, "1", True, "n[0]", "0", str(tmp_path / "app_cycle1.log"))]
    assert (folder / "cycle_info.42.current").resolve() == folder / "cycle_info.42.0.1"


def test_the_iteration_file_reader(tmp_path):
    path = tmp_path / "f"
    assert read_iteration_file(str(path)) == (None, None)  # not written yet: no problem
    path.write_text(" 42 \n")
    assert read_iteration_file(str(path)) == (42, None)
    path.write_text("")
    assert read_iteration_file(str(path)) == (None, None)
    path.write_text("garbage")
    value, problem = read_iteration_file(str(path))
    assert value is None and "holds no integer ('garbage')" in problem
    value, problem = read_iteration_file(str(tmp_path))  # a folder
    assert value is None and problem.startswith("cannot read")
