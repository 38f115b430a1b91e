"""The agent's telemetry: status rows and lines, straggler reports and progress records, with fakes."""

from __future__ import annotations

import io

import pytest

from mbr_launch.report.events import EventLog
from mbr_launch.config.build import build_config
from mbr_launch.config.settings import resolve
from mbr_launch.agent.features.telemetry import Telemetry

from testkit.helpers import validate

pytestmark = pytest.mark.timeout(10)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _telemetry(clock: Clock, stream, **cli):
    settings = resolve({"straggler_interval": "10", "status_interval": "5", **cli}, {}, {})
    # A single node with no port: a private c10d rendezvous, so building asks nothing of the host.
    cfg = build_config(settings, script=__file__, environ={})
    log = EventLog(None, node="n", clock=clock)
    said: list[str] = []
    return Telemetry(cfg, log, said.append, clock=clock, stream=stream), log, said


def test_segments_stragglers_and_plain_status():
    clock = Clock()
    tel, log, said = _telemetry(clock, io.StringIO())
    assert tel.view.mode == "plain"  # not a terminal
    assert tel.monitor_config() == {"initial": 3600.0, "subsequent": 1800.0, "report_interval": 1.0,
                                    "status_interval": 5.0}
    tel.begin(0, [0, 1])
    tel.on_first_step({"local_rank": 0, "rank": 0, "t": 3.0, "monotonic": 1003.0})
    tel.on_steps({"ranks": [
        {"local_rank": 0, "rank": 0, "steps": 5, "index": 5, "periods": [0.02] * 4, "cpu": [0.01] * 4,
         "first": 1003.0, "last": 1004.0, "checkpoint": None},
        {"local_rank": 1, "rank": 1, "steps": 5, "index": 5, "periods": [0.02] * 4, "cpu": [0.02] * 4,
         "first": 1003.1, "last": 1004.1, "checkpoint": None}]})
    tel.on_status({"ranks": [{"local_rank": 0, "rank": 0, "state": "armed", "steps": 5, "last_heartbeat_age": None,
                              "last_step_age": 0.3, "open_sections": []},
                             {"local_rank": 1, "rank": 1, "state": "monitoring", "last_heartbeat_age": 1.5,
                              "open_sections": ["step"]}]})
    assert tel.next_tick() == 1005.0
    clock.now = 1005.0
    assert tel.tick(0) is None
    assert said[-1] == "status: 2 ranks: 1 stepping, 1 monitoring · step 5 · 20 ms/step · sections: step 1/2"
    clock.now = 1010.0
    report = tel.tick(0)
    assert report is not None and report.stragglers == [1]
    assert any(line.startswith("STRAGGLER: rank 1") for line in said)
    clock.now = 1012.0
    tel.end("failure", "hang")
    tel.begin(1, [1])
    assert tel.starts == {0: 1, 1: 2}
    names = [r["event"] for r in log.records]
    assert names == ["first_step", "straggler", "progress"]
    progress = log.records[-1]
    assert (progress["first_step"], progress["last_step"], progress["ended"]) == (3.0, 4.1, 12.0)
    assert progress["cause"] == "failure" and progress["steps"] == 5
    assert all(validate(r) == [] for r in log.records)


def test_table_renders_and_off_is_silent():
    clock = Clock()
    tel, _log, said = _telemetry(clock, io.StringIO(), status="off")
    assert tel.view.mode == "off" and tel.next_tick() is None
    tel.rows = {0: {"local_rank": 0, "rank": 0, "state": "armed", "steps": 3, "last_step_age": 0.1,
                    "last_step_time": 0.0105, "step": 3}}
    from rich.console import Console

    out = io.StringIO()
    Console(file=out, width=120).print(tel.table())
    text = out.getvalue()
    assert "stepping" in text and "10.5 ms" in text and "0.1 s ago" in text
    assert said == []


def test_plain_status_is_one_short_line_for_eight_ranks_and_never_repeats():
    """Issue 15, finding 7: one summary line of ~100 columns whatever the number of ranks, printed only when
    it differs from the last one (start-up used to repeat identical 800-character lines)."""
    clock = Clock()
    tel, _log, said = _telemetry(clock, io.StringIO())
    tel.begin(0, list(range(8)))

    def status(step_age: float | None, step: int | None, sections: list[str]) -> None:
        tel.on_status({"ranks": [{"local_rank": lr, "rank": lr, "state": "monitoring" if step else "armed",
                                  "last_heartbeat_age": None, "last_step_age": step_age, "steps": step or 0,
                                  "step": step, "open_sections": sections} for lr in range(8)]})

    def tick() -> None:
        clock.now += 5.0
        tel.tick(0)

    status(None, None, [])  # start-up: nothing changes for three intervals
    tick(), tick(), tick()
    assert said == ["status: 8 ranks armed"]
    tel.on_steps({"ranks": [{"local_rank": lr, "rank": lr, "steps": 120, "index": 120,
                             "periods": [0.45 if lr == 3 else 0.31], "cpu": []} for lr in range(8)]})
    status(0.2, 120, ["step"])
    tick()
    assert said[-1] == ("status: 8 ranks monitoring · step 120 · 310 ms/step · slowest rank 3 (450 ms) · "
                        "sections: step")
    tick()
    assert len(said) == 2  # the same again: not printed
    status(12.4, 120, ["step", "checkpoint"])  # a stall: the quietest rank is named, anew each interval
    tick()
    tel.begin(1, list(range(8)))  # a restart
    status(17.4, 120, ["step", "checkpoint"])
    tick()
    assert said[2:] == [
        "status: 8 ranks monitoring · step 120 · 310 ms/step · rank 0 quiet for 12 s",  # 102 columns in full
        # after a restart autobeat's count starts again, and the line says so (the step time gives way)
        "status: 8 ranks monitoring · step 120 since the restart · restarts 1 · rank 0 quiet for 17 s"]
    assert all(len(line) <= 100 for line in said), said


def test_the_iteration_an_nvrx_client_reports_is_shown():
    clock = Clock()
    tel, _log, said = _telemetry(clock, io.StringIO())
    tel.begin(0, [0, 1])
    tel.on_status({"ranks": [{"local_rank": lr, "rank": lr, "state": "monitoring", "last_heartbeat_age": 0.1,
                              "last_step_age": None, "steps": 0, "step": None, "open_sections": ["step"],
                              "iteration": 1200 + lr, "nvrx": "0.6+"} for lr in (0, 1)]})
    clock.now += 5.0
    tel.tick(0)
    assert said == ["status: 2 ranks monitoring · iteration 1200-1201 · sections: step"]
    from rich.console import Console

    out = io.StringIO()
    Console(file=out, width=120).print(tel.table())
    assert "it 1201" in out.getvalue()


def test_the_reported_iteration_wins_over_the_autobeat_count_after_a_restart():
    """A rank with both: autobeat counted 7 optimizer steps since its restart, the NVRx client reports
    iteration 1207 (resumed from the checkpoint at 1200): the line and the table show the run's step."""
    clock = Clock()
    tel, _log, said = _telemetry(clock, io.StringIO())
    tel.begin(0, [0])
    tel.begin(1, [0])  # a restart
    tel.on_status({"ranks": [{"local_rank": 0, "rank": 0, "state": "monitoring", "last_heartbeat_age": 0.1,
                              "last_step_age": 0.1, "steps": 7, "step": 7, "open_sections": [],
                              "iteration": 1207, "nvrx": "0.6+"}]})
    clock.now += 5.0
    tel.tick(0)
    assert said[-1].startswith("status: 1 rank monitoring · iteration 1207"), said
    assert "step 7" not in said[-1]
    from rich.console import Console

    out = io.StringIO()
    Console(file=out, width=120).print(tel.table())
    assert "it 1207" in out.getvalue()
