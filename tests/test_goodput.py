"""Goodput accounting with fixed event histories."""

from __future__ import annotations

import pytest

from mbr_launch.decide.goodput import CATEGORIES, compute
from mbr_launch.decide.goodput_text import render

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
    assert "Goodput: 88.2%" in render(g)


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
    assert "failure 1 (round 0, hang): lost 30.0 s" in render(g)


def test_a_hangs_detection_ends_at_its_verdict_and_the_kill_grace_is_restart_time():
    """What real training code found: "detected 13.1 s" after the last step for a 10 s step timeout (the
    culprit's kill grace counted as detection). The record's ``detected`` (the verdict) ends detection; the
    grace and the stop until ``ended`` are restart time."""
    hang = dict(progress(1.0, 54.0, 10.0, 40.0, "failure", detail="hang"), detected=50.5)
    g = compute([hang, progress(56.0, 120.0, 60.0, 118.0, "end", rnd=1), {"event": "end", "t": 121.0}])
    (f,) = g.failures
    assert (f.lost, f.detection, f.restart) == (30.0, 10.5, pytest.approx(3.5 + 6.0))
    assert g.seconds["detection"] == 10.5 and g.seconds["restart"] == pytest.approx(9.5)
    assert sum(g.seconds.values()) == pytest.approx(g.wall)
    spans = [(sp.kind, sp.start, sp.end) for sp in g.spans]
    assert ("detection", 40.0, 50.5) in spans and ("restart", 50.5, 60.0) in spans, spans
    # a log written before ``detected`` existed: detection runs to the attempt's end, as it did
    old = compute([progress(1.0, 54.0, 10.0, 40.0, "failure", detail="hang"), {"event": "end", "t": 60.0}])
    assert old.failures[0].detection == 14.0


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


# ---- the summary's words (issue 15, finding 7) -----------------------------------------------------------


def test_clean_run_explains_every_bucket_it_shows():
    # a short clean run: most of its time is start-up and the script's wind-down after its last step
    text = render(compute([progress(0.13, 2.70, 1.28, 1.82, "end", steps=300), {"event": "end", "t": 2.70}]))
    shown = [line for line in text.splitlines()[1:] if line.strip()]
    assert [line.split()[0] for line in shown] == ["start-up", "training", "other"]
    assert "after the last step" in shown[2]  # "other" says what it is
    assert "launcher 0.1 s, workers 1.1 s" in shown[0]  # start-up split: the launcher's own, then the workers'
    assert all(len(line) <= 80 for line in text.splitlines()), text


def test_no_optimizer_steps_says_so_instead_of_zero_percent():
    text = render(compute([progress(0.1, 1.6, None, None, "end", steps=0), {"event": "end", "t": 1.6}]))
    assert "no optimizer steps seen" in text
    assert "0.0%" not in text and "startup" not in text


def test_crash_loop_that_never_trained_claims_no_training_again():
    records = [progress(0.1, 1.0, None, None, "failure", steps=0, detail="crash"),
               progress(1.4, 2.5, None, None, "failure", rnd=1, steps=0, detail="crash"),
               progress(2.9, 4.0, None, None, "failure", rnd=2, steps=0, detail="crash"), {"event": "end", "t": 4.1}]
    g = compute(records)
    text = render(g)
    assert "training again" not in text and "after the last step" not in text
    assert text.count("restarted; no step seen since") == 2
    assert "failure 3 (round 2, crash): before the first step of its attempt; not restarted" in text
    assert [f.resumed for f in g.failures] == [False, False, False]


def test_last_failure_after_steps_is_not_restarted():
    records = [progress(0.1, 3.0, 1.0, 2.9, "failure", detail="crash"),
               progress(3.5, 6.0, 4.0, 5.9, "failure", rnd=1, detail="crash"), {"event": "end", "t": 6.1}]
    text = render(compute(records))
    assert "failure 1 (round 0, crash): lost 1.9 s of work, detected 0.1 s after the last step; training again " \
           "1.0 s later" in text
    assert "failure 2 (round 1, crash): lost 1.9 s of work, detected 0.1 s after the last step; not restarted" in text
    assert "every step was lost to a failure" in text


def test_spans_tile_the_run_and_sum_to_the_seconds():
    records = [progress(1.0, 20.0, 5.0, 15.0, "failure", checkpoint=10.0, detail="crash"),
               progress(21.0, 25.0, None, None, "failure", rnd=1, detail="crash"),
               progress(26.0, 60.0, 35.0, 59.0, "end", rnd=2)]
    g = compute(records, wall=61.0)
    assert g.spans[0].start == 0.0 and g.spans[-1].end == 61.0
    assert all(a.end == b.start for a, b in zip(g.spans, g.spans[1:]))
    for kind in CATEGORIES:
        assert sum(s.end - s.start for s in g.spans if s.kind == kind) == pytest.approx(g.seconds[kind])
    assert [s.kind for s in g.spans] == ["startup", "productive", "lost", "detection", "restart", "restart",
                                         "productive", "other"]
    assert [s.failure for s in g.spans if s.kind == "restart"] == [0, 1]
    assert g.to_event()["failures"][0]["resumed"] is False and g.to_event()["failures"][1]["resumed"] is True


def test_iterations_an_nvrx_client_reports_say_what_a_failure_redid():
    # Megatron with NVRx 0.6+: attempt 0 reached iteration 1250, attempt 1 resumed from its checkpoint at 1200.
    first = {**progress(1.0, 42.0, 10.0, 40.0, "failure", detail="hang"), "first_iteration": 1000,
             "last_iteration": 1250}
    second = {**progress(45.0, 120.0, 55.0, 118.0, "end", rnd=1), "first_iteration": 1200, "last_iteration": 1900}
    g = compute([first, second, {"event": "end", "t": 121.0}])
    (f,) = g.failures
    assert (f.reached, f.resumed_at, f.redone) == (1250, 1200, 50)
    assert g.to_event()["failures"][0]["iterations_redone"] == 50
    assert "50 iteration(s) redone (reached 1250, resumed at 1200)" in render(g)
    # Without reported iterations nothing is claimed.
    g = compute([progress(1.0, 42.0, 10.0, 40.0, "failure", detail="hang"), {"event": "end", "t": 50.0}])
    assert g.failures[0].redone is None and "redone" not in render(g)


@pytest.mark.timeout(30)
def test_thousands_of_failed_attempts_are_accounted_one_by_one():
    """A log of 8,000 failed attempts (a crash loop left running, or a neighbour's crafted log handed to
    ``mbr-launch report``) took minutes: each span looked its failure up with ``list.index`` (dataclass
    equality). Every failure keeps its own spans."""
    n = 8000
    records = [progress(i * 10.0, i * 10.0 + 9.0, i * 10.0 + 1.0, i * 10.0 + 8.0, "failure", rnd=0, detail="crash")
               for i in range(n)]
    g = compute(records + [{"event": "end", "t": n * 10.0 + 20.0}])
    assert len(g.failures) == n
    assert {s.failure for s in g.spans if s.kind == "lost"} == set(range(n))
