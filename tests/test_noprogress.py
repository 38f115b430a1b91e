"""Progress across restarts (``decide.noprogress``): pure scoring with injected facts, NVRx 0.7's rules
(``progress_tracker.py``) case by case."""

from __future__ import annotations

import pytest

from mbr_launch.decide.noprogress import (Facts, Rule, Source, Stuck, Tracking, cycle_line, decode, decode_tracking,
                                          encode, encode_tracking, initial, parse_iteration, score, stop_line)

pytestmark = pytest.mark.timeout(10)

FILE = "/ckpt/latest_checkpointed_iteration.txt"


def run(rule: Rule, tracking: Tracking, *cycles: Facts):
    """Score ``cycles`` in turn; every verdict."""
    out = []
    for facts in cycles:
        scored = score(rule, tracking, facts)
        tracking = scored.tracking
        out.append(scored)
    return out


def test_off_scores_nothing():
    scored = score(Rule(max_cycles=0), Tracking(), Facts(cycle=0, steps=0, iteration=5))
    assert (scored.progress, scored.stop, scored.tracking) == (None, False, Tracking())


def test_checkpoint_file_stuck_for_n_cycles_stops_after_the_nth_first_cycle_included():
    rule = Rule(max_cycles=3, file=FILE)
    verdicts = run(rule, initial(rule, 100), *(Facts(cycle=c, file_iteration=100) for c in range(3)))
    assert [v.progress for v in verdicts] == [False, False, False]
    assert [len(v.tracking.stuck) for v in verdicts] == [1, 2, 3]
    assert [v.stop for v in verdicts] == [False, False, True]
    line = verdicts[-1].reason
    assert line.startswith("no progress in 3 cycles in a row (cycle 0: checkpoint iteration 100 -> 100; "
                           "cycle 1: checkpoint iteration 100 -> 100; cycle 2: checkpoint iteration 100 -> 100; ")
    assert "at least 1 needed" in line and line.endswith("(--ft-max-no-progress-cycles 3)")


def test_progress_resets_the_count():
    rule = Rule(max_cycles=2, file=FILE)
    verdicts = run(rule, initial(rule, 100), Facts(0, file_iteration=100), Facts(1, file_iteration=150),
                   Facts(2, file_iteration=150), Facts(3, file_iteration=151))
    assert [(v.start, v.end, v.progress) for v in verdicts] == [(100, 100, False), (100, 150, True),
                                                                (150, 150, False), (150, 151, True)]
    assert not any(v.stop for v in verdicts)
    assert verdicts[-1].tracking.stuck == ()


def test_an_advance_below_min_progress_iterations_is_no_progress():
    rule = Rule(max_cycles=2, min_iterations=50, file=FILE)
    verdicts = run(rule, initial(rule, 100), Facts(0, file_iteration=120), Facts(1, file_iteration=169))
    assert [v.progress for v in verdicts] == [False, False] and verdicts[-1].stop
    assert "(cycle 0: checkpoint iteration 100 -> 120; cycle 1: checkpoint iteration 120 -> 169; an advance of " \
           "at least 50 needed)" in verdicts[-1].reason


def test_an_unknown_checkpoint_iteration_leaves_the_record_as_it_was():
    """NVRx 0.7: scoring an unreadable file as 0 would count a step back now and a leap forward later."""
    rule = Rule(max_cycles=2, file=FILE)
    first = score(rule, initial(rule, 100), Facts(0, file_iteration=100))
    unknown = score(rule, first.tracking, Facts(1, file_iteration=None, file_problem="cannot read it: EIO"))
    assert (unknown.progress, unknown.source, unknown.tracking) == (None, None, first.tracking)
    assert "cannot read it: EIO" in unknown.note and "not scored" in unknown.note
    assert cycle_line(rule, unknown).startswith("cycle 1: checkpoint iteration unknown (cannot read it: EIO)")
    last = score(rule, unknown.tracking, Facts(2, file_iteration=100))
    assert last.stop and "cycle 0: checkpoint iteration 100 -> 100; cycle 2: checkpoint iteration 100 -> 100" \
        in last.reason


def test_nothing_reported_yet_is_not_scored():
    """No file at launch and none (or 0) at the cycle's end: as NVRx, the job is left to its restart budget."""
    rule = Rule(max_cycles=1, file=FILE)
    missing = score(rule, initial(rule, None), Facts(0))
    assert missing.progress is None and "holds no iteration yet" in missing.note
    zero = score(rule, initial(rule, None), Facts(0, file_iteration=0))
    assert zero.progress is None and zero.note.startswith("no iteration reported yet")
    first = score(rule, initial(rule, None), Facts(0, file_iteration=10))
    assert (first.start, first.end, first.progress) == (0, 10, True)


def test_the_file_wins_over_what_the_ranks_report():
    rule = Rule(max_cycles=1, file=FILE)
    scored = score(rule, initial(rule, 100), Facts(0, file_iteration=100, iteration=500, steps=40))
    assert (scored.source, scored.progress, scored.stop) == (Source.FILE, False, True)


def test_iterations_reported_by_nvrx_clients():
    rule = Rule(max_cycles=3)
    verdicts = run(rule, initial(rule, None), Facts(0, iteration=0), Facts(1, iteration=200, steps=0),
                   Facts(2), Facts(3, iteration=150), Facts(4, iteration=160))
    assert [(v.source, v.start, v.end, v.progress) for v in verdicts] == [
        (None, None, None, None),  # 0 before and 0 now: nothing reported yet
        (Source.ITERATION, 0, 200, True),
        (Source.ITERATION, 200, None, False),  # crashed before any rank reported: no progress, baseline kept
        (Source.ITERATION, 200, 150, False),  # as NVRx: the next cycle is measured from this one's
        (Source.ITERATION, 150, 160, True)]
    assert verdicts[2].tracking.stuck[-1].describe() == "cycle 2: iteration 200 -> none reported"


def test_optimizer_steps_for_scripts_without_nvrx():
    rule = Rule(max_cycles=2, min_iterations=3)
    verdicts = run(rule, initial(rule, None), Facts(0, steps=0), Facts(1, steps=None), Facts(2, steps=7),
                   Facts(3, steps=2), Facts(4, steps=None))
    assert [(v.source, v.end, v.progress) for v in verdicts] == [
        (None, None, None), (None, None, None),  # no step was ever seen: not scored
        (Source.STEPS, 7, True), (Source.STEPS, 2, False), (Source.STEPS, 0, False)]
    assert verdicts[-1].stop
    assert "(cycle 3: 2 optimizer steps; cycle 4: 0 optimizer steps; an advance of at least 3 needed)" \
        in verdicts[-1].reason


def test_one_cycle_limit_stops_at_the_first_cycle_without_progress():
    rule = Rule(max_cycles=1, file=FILE)
    scored = score(rule, initial(rule, 7), Facts(0, file_iteration=7))
    assert scored.stop and scored.reason.startswith("no progress in 1 cycle in a row (cycle 0:")


@pytest.mark.parametrize("text, value", [(" 12\n", 12), ("0", 0), ("", None), ("  \n", None), ("abc", None),
                                         ("12.5", None), ("-3", 0), ("+7", 7), ("1_000", 1000)])
def test_the_iteration_file_is_read_as_nvrx_reads_it(text, value):
    assert parse_iteration(text) == value


def test_the_stop_line_of_a_long_run_shows_its_ends():
    stuck = tuple(Stuck(c, Source.STEPS, None, 0) for c in range(10))
    line = stop_line(Rule(max_cycles=10), stuck)
    assert "(cycle 0: 0 optimizer steps; cycle 1: 0 optimizer steps; ...; cycle 7: 0 optimizer steps; " in line
    assert "cycle 2:" not in line and line.startswith("no progress in 10 cycles in a row")


def test_the_store_copy_round_trips_and_garbage_reads_as_nothing():
    rule = Rule(max_cycles=2, file=FILE)
    scored = run(rule, initial(rule, 3), Facts(4, file_iteration=3), Facts(5, file_iteration=3))[-1]
    assert decode(encode(scored)) == scored
    assert decode_tracking(encode_tracking(scored.tracking)) == scored.tracking
    for bad in (b"", b"{", b"[]", b'{"tracking": 3}', b'{"cycle": 1, "tracking": {"stuck": [[1, "x", 0, 0]]}}'):
        assert decode(bad) is None
    assert decode_tracking("nonsense") is None


def test_the_store_copy_is_read_by_the_bounded_decoder():
    """Another node's record: a non-finite number, a value nested past the bound or over the size bound reads
    as nothing recorded (``outside.json_value``), as garbage does."""
    rule = Rule(max_cycles=2, file=FILE)
    scored = run(rule, initial(rule, 3), Facts(4, file_iteration=3))[-1]
    good = encode(scored)
    assert decode(good) == scored
    assert decode(good.replace('"stop": false', '"stop": false, "extra": NaN')) is None
    assert decode(good.replace('"stop": false', '"stop": false, "extra": 1e999')) is None
    assert decode(good.replace('"stop": false', '"stop": false, "extra": ' + "[" * 10 + "]" * 10)) is None
    assert decode(good.replace('"stop": false', '"stop": false, "extra": "' + "x" * (5 << 20) + '"')) is None
    assert decode_tracking('{"baseline": 3, "stuck": [], "pad": NaN}') is None
    assert decode_tracking('{"baseline": 3, "stuck": []}') is not None
