"""The shared events.jsonl reader that tests and benchmarks use."""

from __future__ import annotations

import pytest

from mbr_launch.report.events import EventLog, event_time
from testkit.eventlog import first_event, read_events, read_log_dir


def test_reads_what_eventlog_wrote_and_skips_a_cut_last_line(tmp_path):
    path = tmp_path / "run" / "events.jsonl"
    log = EventLog(path, node="n0")
    log.emit("start", run_id="r")
    log.emit("failure", round=0, rank=1, cause="crash")
    log.close()
    with open(path, "a") as f:
        f.write('{"v": 1, "ts": "2026-')  # the agent is still writing this line
    records = read_events(path)
    assert [r["event"] for r in records] == ["start", "failure"]
    assert read_log_dir(tmp_path) == records
    assert first_event(records, "failure", round=0)["rank"] == 1
    assert first_event(records, "failure", round=1) is None
    assert abs(event_time(records[0]) - event_time(records[1])) < 60


def test_a_bad_line_before_the_last_is_an_error(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text('{"event": "start"}\nnot json\n{"event": "end"}\n')
    with pytest.raises(ValueError, match="events.jsonl:2"):
        read_events(path)
