"""Pure deadline logic of one rank, driven by an explicit clock (no IO, no sleeping)."""

from __future__ import annotations

import pytest

from mbr_launch.monitor.deadlines import (
    TRANSITIONS,
    Expiry,
    InvalidTransition,
    Kind,
    Phase,
    RankWatch,
    SectionError,
    Timeouts,
    Trigger,
    next_deadline,
    next_expiry,
)

pytestmark = pytest.mark.timeout(10)


def watch(initial=10.0, subsequent=5.0, sections=None, oos=None, *, at=100.0) -> RankWatch:
    w = RankWatch(Timeouts(initial, subsequent, dict(sections or {}), oos))
    w.arm(at - 1)
    w.init(at)
    return w


def test_nothing_is_timed_before_init():
    w = RankWatch(Timeouts(1.0, 1.0, {}, 1.0))
    w.arm(0.0)
    assert w.phase is Phase.ARMED
    assert next_deadline(w) is None
    assert next_expiry(w, 1e9) is None


def test_initial_heartbeat_runs_from_init():
    w = watch(initial=10.0, subsequent=5.0)
    assert next_deadline(w) == 110.0
    assert next_expiry(w, 109.999) is None
    v = next_expiry(w, 110.5)
    assert v is not None and v.kind is Kind.INITIAL_HEARTBEAT and v.timeout == 10.0
    assert v.elapsed == pytest.approx(10.5)


def test_subsequent_heartbeat_runs_from_last_heartbeat():
    w = watch(initial=10.0, subsequent=5.0)
    assert w.heartbeat(103.0) is True  # first
    assert w.heartbeat(104.0) is False
    assert next_deadline(w) == 109.0
    assert next_expiry(w, 108.9) is None
    v = next_expiry(w, 109.0)
    assert v is not None and v.kind is Kind.HEARTBEAT and v.elapsed == pytest.approx(5.0)


def test_disabled_timeouts_never_expire():
    w = watch(initial=None, subsequent=None, sections={"step": None}, oos=None)
    assert next_deadline(w) is None
    w.heartbeat(101.0)
    w.open_section("step", 102.0)
    assert next_deadline(w) is None
    assert next_expiry(w, 1e12) is None


def test_section_timeout_runs_from_open():
    w = watch(initial=None, subsequent=None, sections={"step": 3.0}, oos=50.0)
    w.open_section("step", 101.0)
    assert next_deadline(w) == 104.0
    v = next_expiry(w, 104.2)
    assert v is not None and v.kind is Kind.SECTION and v.section == "step" and v.timeout == 3.0


def test_earliest_of_several_open_sections_wins():
    w = watch(initial=None, subsequent=None, sections={"a": 10.0, "b": 2.0}, oos=None)
    w.open_section("a", 100.0)
    w.open_section("b", 101.0)
    assert next_deadline(w) == 103.0
    assert next_expiry(w, 103.0).section == "b"  # type: ignore[union-attr]
    w.close_section("b", 102.0)
    assert next_deadline(w) == 110.0
    assert next_expiry(w, 110.0).section == "a"  # type: ignore[union-attr]


def test_out_of_section_runs_from_init_then_from_last_close():
    w = watch(initial=None, subsequent=None, sections={"step": 100.0}, oos=4.0)
    assert next_deadline(w) == 104.0
    w.open_section("step", 103.0)
    assert next_deadline(w) == 203.0  # out-of-section timer stopped while a section is open
    w.close_section("step", 120.0)
    assert next_deadline(w) == 124.0
    v = next_expiry(w, 124.1)
    assert v is not None and v.kind is Kind.OUT_OF_SECTION and v.section is None


def test_close_all_restarts_out_of_section():
    w = watch(initial=None, subsequent=None, sections={"a": 50.0, "b": 50.0}, oos=4.0)
    w.open_section("a", 101.0)
    w.open_section("b", 102.0)
    w.close_all_sections(110.0)
    assert w.open_sections == {}
    assert next_deadline(w) == 114.0


def test_reopen_restarts_the_section_timer():
    w = watch(initial=None, subsequent=None, sections={"step": 5.0}, oos=None)
    w.open_section("step", 101.0)
    w.close_section("step", 104.0)
    w.open_section("step", 105.0)
    assert next_deadline(w) == 110.0


def test_double_open_and_close_of_closed_are_errors_as_in_nvrx():
    w = watch(sections={"step": 5.0})
    w.open_section("step", 101.0)
    with pytest.raises(SectionError, match="already open"):
        w.open_section("step", 102.0)
    w.close_section("step", 103.0)
    with pytest.raises(SectionError, match="not open"):
        w.close_section("step", 104.0)


def test_unknown_section_is_accepted_and_untimed():
    w = watch(initial=None, subsequent=None, sections={"step": 5.0}, oos=2.0)
    w.open_section("mystery", 101.0)
    assert "mystery" in w.open_sections
    assert next_deadline(w) is None  # out-of-section paused, no timeout for the unknown name


def test_config_update_applies_immediately_to_open_sections_and_heartbeats():
    w = watch(initial=100.0, subsequent=100.0, sections={"step": 100.0}, oos=None)
    w.open_section("step", 101.0)
    w.update_timeouts(sections={"step": 2.0}, out_of_section=7.0, update_hb=False, update_sections=True)
    assert next_deadline(w) == 103.0
    w.update_timeouts(initial=1.0, subsequent=1.0, update_hb=True, update_sections=False)
    assert next_deadline(w) == 101.0  # initial heartbeat from init at 100
    v = next_expiry(w, 101.5)
    assert v is not None and v.kind is Kind.INITIAL_HEARTBEAT and v.timeout == 1.0
    assert w.timeouts.out_of_section == 7.0


def test_update_replaces_the_section_mapping_like_nvrx():
    w = watch(sections={"a": 1.0, "b": 1.0})
    w.update_timeouts(sections={"a": 3.0}, out_of_section=None, update_hb=False, update_sections=True)
    assert w.timeouts.sections == {"a": 3.0}


def test_expiry_is_reported_once_per_arm():
    w = watch(initial=1.0)
    v = next_expiry(w, 102.0)
    assert v is not None
    w.expire()
    assert w.phase is Phase.EXPIRED
    assert next_expiry(w, 1e9) is None
    w.heartbeat(103.0)  # late messages are acknowledged and ignored
    assert w.heartbeats == 0 and next_expiry(w, 1e9) is None
    with pytest.raises(InvalidTransition):
        w.expire()
    w.arm(200.0)
    w.init(201.0)
    assert next_deadline(w) == 202.0


def test_a_client_that_initialises_again_after_an_expiry_is_watched_again():
    """An NVRx in-process restart reconnects its client: a new session, with fresh deadlines."""
    w = watch(initial=1.0, subsequent=5.0)
    w.heartbeat(100.5)
    assert next_expiry(w, 106.0) is not None
    w.expire()
    w.disconnect()  # shutdown_workload_monitoring: still expired
    assert w.phase is Phase.EXPIRED and next_deadline(w) is None
    w.init(107.0)
    assert w.phase is Phase.MONITORING and w.heartbeats == 0 and next_deadline(w) == 108.0
    assert w.heartbeat(107.5)  # the first heartbeat of the new session
    assert next_deadline(w) == 112.5


def test_rearm_restores_configured_timeouts():
    w = watch(initial=10.0, subsequent=5.0, sections={"s": 1.0})
    w.update_timeouts(initial=99.0, subsequent=99.0, update_hb=True, update_sections=False)
    w.arm(300.0)
    assert w.timeouts.initial == 10.0 and w.timeouts.subsequent == 5.0


def test_disconnect_stops_timers_and_reinit_restarts_them():
    w = watch(initial=10.0, subsequent=5.0, sections={"s": 1.0}, oos=3.0)
    w.heartbeat(101.0)
    w.open_section("s", 101.5)
    w.disconnect()
    assert w.phase is Phase.ARMED and next_deadline(w) is None and w.open_sections == {}
    w.init(150.0)
    assert w.heartbeats == 0 and next_deadline(w) == 153.0


def test_disarm_stops_everything():
    w = watch(initial=1.0)
    w.disarm()
    assert w.phase is Phase.DISARMED and next_expiry(w, 1e9) is None


@pytest.mark.parametrize(
    "action",
    [
        lambda w: w.heartbeat(1.0),
        lambda w: w.open_section("s", 1.0),
        lambda w: w.update_timeouts(update_hb=False, update_sections=False),
        lambda w: w.expire(),
    ],
)
def test_messages_before_init_are_invalid_transitions(action):
    w = RankWatch(Timeouts())
    w.arm(0.0)
    with pytest.raises(InvalidTransition) as err:
        action(w)
    assert err.value.phase is Phase.ARMED


def test_invalid_transitions_from_disarmed():
    w = RankWatch(Timeouts())
    for bad in (lambda: w.init(1.0), w.disconnect, w.expire, lambda: w.heartbeat(1.0)):
        with pytest.raises(InvalidTransition):
            bad()


def test_transition_table_is_total_over_listed_pairs_only():
    # Every (phase, trigger) pair is either in the table or raises: nothing falls through silently.
    for phase in Phase:
        for trigger in Trigger:
            w = RankWatch(Timeouts())
            w.phase = phase
            if (phase, trigger) in TRANSITIONS:
                w._go(trigger)
                assert w.phase is TRANSITIONS[(phase, trigger)]
            else:
                with pytest.raises(InvalidTransition):
                    w._go(trigger)


# ---- NVRx 0.6+ clients ------------------------------------------------------------------------------------


def newer(sections, oos=None, *, warmup=5, at=100.0, timeouts=None) -> RankWatch:
    w = RankWatch(Timeouts(None, None, dict(sections), oos))
    w.arm(at - 1)
    w.init(at, newer=True, warmup_iterations=warmup, timeouts=timeouts)
    return w


def test_newer_client_out_of_section_waits_for_the_first_step():
    w = newer({"step": 30.0}, oos=2.0)
    assert next_expiry(w, 1000.0) is None  # start-up outside any section: not timed
    w.open_section("setup", 1000.0)
    w.close_section("setup", 1001.0)
    assert next_deadline(w) is None  # a section other than "step" does not start it
    w.open_section("step", 1002.0)
    w.close_section("step", 1003.0)
    assert next_expiry(w, 1005.5) == Expiry(Kind.OUT_OF_SECTION, None, 2.0, 2.5)


def test_newer_client_out_of_section_from_init_without_sections_or_with_warmup():
    for sections in ({}, {"step": 30.0, "warmup": 60.0}):
        w = newer(sections, oos=2.0)
        assert next_deadline(w) == 102.0, sections


def test_041_client_out_of_section_from_init_with_sections():
    w = watch(sections={"step": 30.0}, oos=2.0)
    assert next_deadline(w) == 102.0


def test_warmup_times_the_first_steps_from_the_first_reported_iteration():
    w = newer({"step": 1.0, "warmup": 10.0}, warmup=2)
    w.open_section("step", 100.0, iteration=50)
    assert next_deadline(w) == 110.0  # iteration 50 - 50 < 2: warmup's
    w.close_section("step", 105.0, iteration=50)
    w.open_section("step", 105.0, iteration=51)
    assert next_deadline(w) == 115.0
    w.close_section("step", 106.0, iteration=51)
    w.open_section("step", 106.0, iteration=52)  # 52 - 50 = 2: step's own
    assert next_expiry(w, 107.5) == Expiry(Kind.SECTION, "step", 1.0, 1.5)
    assert w.iteration == 52 and w.first_iteration == 50


def test_warmup_needs_reported_iterations_and_newer_rules():
    w = newer({"step": 1.0, "warmup": 10.0})
    w.open_section("step", 100.0)  # no iteration reported: step's own timeout
    assert next_deadline(w) == 101.0
    w = watch(sections={"step": 1.0, "warmup": 10.0})  # a 0.4.1 client: "warmup" is just a section name
    w.open_section("step", 100.0, iteration=1)
    assert next_deadline(w) == 101.0


def test_only_step_messages_set_the_iteration():
    w = newer({"step": 1.0, "setup": 5.0})
    w.open_section("setup", 100.0, iteration=7)
    assert w.iteration is None
    w.close_section("setup", 100.5, iteration=7)
    w.open_section("step", 101.0, iteration=9)
    assert (w.first_iteration, w.iteration) == (9, 9)


def test_init_takes_the_versions_timeouts_unless_the_client_updated_them():
    version = Timeouts(None, None, {"step": 30.0}, None)
    w = newer({"step": 30.0}, timeouts=version)
    assert (w.timeouts.initial, w.timeouts.subsequent) == (None, None) and next_deadline(w) is None
    w.update_timeouts(initial=50.0, subsequent=20.0, update_hb=True, update_sections=False)
    w.init(200.0, newer=True, timeouts=version)  # a re-init (in-process restart) keeps the calculated ones
    assert (w.timeouts.initial, w.timeouts.subsequent) == (50.0, 20.0)
    w.arm(300.0)  # a new round: the configured ones again, then the version's at init
    w.init(301.0, newer=True, timeouts=version)
    assert w.timeouts.subsequent is None


def test_the_iterations_outlive_a_disconnect_until_the_next_session():
    w = newer({"step": 5.0})
    w.open_section("step", 100.0, iteration=40)
    w.close_section("step", 101.0, iteration=41)
    w.disconnect()  # the rank crashed: what it reached is still there for the agent
    assert (w.first_iteration, w.iteration) == (40, 41)
    w.disarm()  # and after the agent disarmed it
    assert (w.first_iteration, w.iteration) == (40, 41)
    w.arm(102.0)  # the next round starts them over
    assert (w.first_iteration, w.iteration) == (None, None)
