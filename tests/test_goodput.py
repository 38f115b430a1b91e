"""Goodput accounting with fixed event histories."""

from __future__ import annotations

import pytest

from mbr_launch.decide.goodput import CATEGORIES, compute

pytestmark = pytest.mark.timeout(10)


def progress(started, ended, first, last, cause, checkpoint=None, steps=10, rnd=0, detail=None):
    return {"event": "progress", "t": ended, "round": rnd, "started": started, "ended": ended, "first_step": first,
            "last_step": last, "checkpoint": checkpoint, "cause": cause, "steps": steps, "cause_detail": detail}


def test_clean_run():
    g = compute([progress(1.0, 101.0, 10.0, 100.0, "end"), {"event": "end", "t": 102.0}])
    assert g.wall == 102.0
    assert g.seconds == {"startup": 10.0, "productive": 90.0, "lost": 0.0, "detection": 0.0, "restart": 0.0,
                         "other": 2.0}
    assert g.fraction == pytest.approx(90 / 102)
    assert not g.failures
    assert "Goodput: 88.2%" in g.render()


def test_hang_then_restart_without_checkpoints_loses_the_whole_attempt():
    records = [progress(1.0, 42.0, 10.0, 40.0, "failure", detail="hang"),
               progress(45.0, 120.0, 55.0, 118.0, "end", rnd=1), {"event": "end", "t": 121.0}]
    g = compute(records)
    s = g.seconds
    assert s["startup"] == 10.0
    assert s["lost"] == 30.0  # a plain script starts over: all of attempt 0's steps
    assert s["detection"] == 2.0
    assert s["restart"] == pytest.approx(13.0)  # 42 -> 55: stop, rendezvous, start-up, first step
    assert s["productive"] == 63.0
    assert s["other"] == pytest.approx(3.0)
    assert sum(s.values()) == pytest.approx(g.wall)
    assert sum(g.fractions().values()) == pytest.approx(1.0)
    (f,) = g.failures
    assert (f.cause, f.lost, f.detection, f.restart) == ("hang", 30.0, 2.0, pytest.approx(13.0))
    assert "failure 1 (round 0, hang): lost 30.0 s" in g.render()


def test_checkpoint_keeps_work_before_it():
    g = compute([progress(0.0, 50.0, 10.0, 48.0, "failure", checkpoint=30.0, detail="crash"),
                 progress(52.0, 80.0, 60.0, 79.0, "end", rnd=1)], wall=80.0)
    assert g.seconds["productive"] == pytest.approx(20.0 + 19.0)
    assert g.failures[0].lost == pytest.approx(18.0)


def test_failure_before_the_first_step_extends_the_downtime():
    records = [progress(0.0, 20.0, 5.0, 15.0, "failure", detail="crash"),
               progress(21.0, 25.0, None, None, "failure", rnd=1, detail="crash"),
               progress(26.0, 60.0, 35.0, 59.0, "end", rnd=2)]
    g = compute(records, wall=60.0)
    assert [f.cause for f in g.failures] == ["crash", "crash"]
    assert g.failures[0].restart == pytest.approx(5.0)  # 20 -> 25, then the second failure owns the rest
    assert g.failures[1].restart == pytest.approx(10.0)  # 25 -> 35
    assert sum(g.seconds.values()) == pytest.approx(60.0)
    assert set(g.seconds) == set(CATEGORIES)


def test_no_steps_at_all():
    g = compute([progress(0.0, 5.0, None, None, "end", steps=0)], wall=6.0)
    assert g.seconds["productive"] == 0.0 and g.seconds["startup"] == 5.0
    assert sum(g.seconds.values()) == pytest.approx(6.0)
