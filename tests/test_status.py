"""The agent's telemetry: status rows and lines, straggler reports and progress records, with fakes."""

from __future__ import annotations

import io

import pytest

from mbr_launch.report.events import EventLog, validate
from mbr_launch.config.build import build_config
from mbr_launch.config.settings import resolve
from mbr_launch.agent.telemetry import Telemetry

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
    assert tel.mode == "plain"  # not a terminal
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
    assert said[-1].startswith("status: rank 0 (local 0) stepping, heartbeat 0.3 s ago, section -, step 5 (20.0 ms)")
    assert "rank 1 (local 1) monitoring, heartbeat 1.5 s ago, section step" in said[-1]
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
    assert tel.mode == "off" and tel.next_tick() is None
    tel.rows = {0: {"local_rank": 0, "rank": 0, "state": "armed", "steps": 3, "last_step_age": 0.1,
                    "last_step_time": 0.0105, "step": 3}}
    from rich.console import Console

    out = io.StringIO()
    Console(file=out, width=120).print(tel.table())
    text = out.getvalue()
    assert "stepping" in text and "10.5 ms" in text and "0.1 s ago" in text
    assert said == []
