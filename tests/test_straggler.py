"""Straggler scores (NVRx definitions) with fixed inputs."""

from __future__ import annotations

import pytest

from mbr_launch.decide.straggler import Score, StragglerCheck, scores

pytestmark = pytest.mark.timeout(10)


def test_relative_score_is_fastest_median_over_own_median():
    result = scores({0: [0.010, 0.011, 0.009], 1: [0.020, 0.021, 0.019], 2: [0.0125, 0.0125, 0.0125]})
    assert result[0].relative == pytest.approx(1.0)
    assert result[1].relative == pytest.approx(0.5)
    assert result[2].relative == pytest.approx(0.8)
    assert all(s.individual == 1.0 for s in result.values())  # first interval: nothing to compare with


def test_individual_score_is_own_best_over_own_current():
    result = scores({0: [0.02, 0.02, 0.02]}, best_medians={0: 0.01})
    assert result[0] == Score(relative=1.0, individual=0.5, median=0.02, best=0.01, samples=3)
    assert result[0].is_straggler(0.7)
    # a faster interval than ever before becomes the new best
    assert scores({0: [0.005]}, best_medians={0: 0.01})[0].best == 0.005


def test_empty_and_zero_times():
    assert scores({}) == {}
    assert scores({0: []}) == {}
    assert scores({0: [0.0], 1: [0.0]})[1].relative == 1.0


def test_check_reports_each_interval_and_tracks_best():
    check = StragglerCheck(interval=10.0, threshold=0.7, min_samples=3)
    check.start(0.0)
    check.add(0, [0.01] * 5)
    check.add(1, [0.02] * 5)
    check.add(2, [0.01])  # too few samples: left out
    assert check.due(9.9) is None
    report = check.due(10.0)
    assert report is not None and report.interval == 1
    assert sorted(report.scores) == [0, 1]
    assert report.stragglers == [1]
    assert any(line.startswith("STRAGGLER: rank 1: relative score 0.50") for line in report.lines())
    event = report.to_event()
    assert event["stragglers"] == [1] and event["ranks"][1]["relative"] == 0.5
    # rank 0 slows down by itself: the individual score sees it
    check.add(0, [0.02] * 5)
    check.add(1, [0.02] * 5)
    second = check.due(20.0)
    assert second is not None and second.scores[0].individual == pytest.approx(0.5)
    assert second.stragglers == [0]
    assert check.due(30.0) is None  # no steps in that interval: no report


def test_interval_zero_disables():
    check = StragglerCheck(interval=0, threshold=0.7)
    check.start(0.0)
    check.add(0, [1.0] * 5)
    assert check.next_due() is None and check.due(1e9) is None
