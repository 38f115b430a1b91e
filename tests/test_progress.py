"""Progress lines where a person waits, as pure logic with injected clocks (the real launches that show them
are in test_waiting.py): when the rendezvous reports, what the back-off counts down, when a stop's grace
speaks and when a signal cuts it short."""

from __future__ import annotations

import signal

from mbr_launch.agent.progress import JoinReport, StopProgress
from mbr_launch.agent.wakeup import Wakeup
from mbr_launch.cluster.joining import JoinState
from mbr_launch.report import exitcodes
from tests.replay import build_world, exit_rank


def test_rendezvous_lines_come_after_a_moment_then_every_few_seconds_or_on_a_change():
    report = JoinReport(min_nodes=2, max_nodes=2, timeout=600)
    one, two = JoinState(joined=1, waiting=0, complete=False), JoinState(joined=2, waiting=0, complete=False)
    assert report.line(1.0, one) is None  # a quick join says nothing
    assert report.line(2.0, one) == "rendezvous: 1 of 2 nodes joined, waiting 2 s of 600 s"
    assert report.line(3.0, one) is None and report.line(6.9, one) is None
    assert report.line(7.0, one) == "rendezvous: 1 of 2 nodes joined, waiting 7 s of 600 s"
    assert report.line(8.0, two) == "rendezvous: 2 of 2 nodes joined, waiting 8 s of 600 s"  # a change: at once
    assert report.line(70.0, two) is not None and report.line(80.0, two) is None  # later: every 30 s
    assert report.line(100.0, two) is not None
    assert "2 of 2 nodes joined" in report.timed_out() and "join_timeout=SECONDS" in report.timed_out()


def test_rendezvous_lines_keep_the_last_count_between_spread_reads():
    # In a large job the state is read only now and then (progress.STATE_READS_PER_SECOND): a line due in
    # between says the latest count, and a read that finds the same count is no change.
    report = JoinReport(min_nodes=512, max_nodes=512, timeout=600)
    seen = JoinState(joined=300, waiting=0, complete=False)
    assert report.line(2.0, seen) == "rendezvous: 300 of 512 nodes joined, waiting 2 s of 600 s"
    assert report.line(7.0, None) == "rendezvous: 300 of 512 nodes joined, waiting 7 s of 600 s"
    assert report.line(8.0, seen) is None


def test_rendezvous_lines_without_a_count_and_behind_a_running_round():
    report = JoinReport(min_nodes=2, max_nodes=4, timeout=30)
    assert report.line(2.0, None) == "rendezvous: waiting 2 s of 30 s for 2-4 nodes"
    assert report.timed_out().startswith("the rendezvous timed out after 30 s (raise")
    line = report.line(3.0, JoinState(joined=3, waiting=1, complete=True))
    assert line == "rendezvous: 1 node(s) queued until the current round's nodes rejoin, waiting 3 s of 30 s"


def test_back_off_counts_down_and_says_why(tmp_path):
    world = build_world(tmp_path, ("max_restarts", 2), ("restart_backoff", 25.0))
    assert world.run([exit_rank(0, 1), exit_rank(0, 1), exit_rank(0, 1)]) == exitcodes.FAILED
    assert world.wakeup.sleeps == [0.0, 5.0, 10.0, 10.0]  # to 20 s left, to 10 s left, to the end
    backing = [line for line in world.said if line.startswith("restarting in")]
    assert backing == ["restarting in 25 s (back-off after 2 quick failures; Ctrl-C stops)",
                       "restarting in 20 s", "restarting in 10 s"], world.said


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Rank:
    def __init__(self, rank: int) -> None:
        self.rank = rank


def test_stop_grace_speaks_after_a_moment_and_a_signal_ends_it():
    clock, said, wakeup = Clock(), [], Wakeup()
    try:
        watch = StopProgress(wakeup, said.append, 30.0, preemption=("SIGTERM", "SIGUSR1"), clock=clock)
        ranks = [Rank(0), Rank(1)]
        assert watch(ranks, ranks, 30.0) is False and said == []  # most stops end within a moment
        clock.now = 1.0
        assert watch(ranks, ranks[1:], 29.0) is False
        assert said == ["stopping rank 1: waiting up to 30 s for it to exit (Ctrl-C kills at once)"]
        clock.now = 3.0
        assert watch(ranks, ranks[1:], 27.0) is False and len(said) == 1
        clock.now = 6.0
        assert watch(ranks, ranks[1:], 24.0) is False and said[-1] == "stopping: rank 1 still running, SIGKILL in 24 s"
        wakeup.post_signal(signal.SIGTERM)  # a preemption signal: the grace is for the checkpoint
        assert watch(ranks, ranks[1:], 23.5) is False
        wakeup.post_signal(signal.SIGINT)
        assert watch(ranks, ranks[1:], 23.0) is True  # SIGKILL now
        assert said[-1] == "received SIGINT while stopping: killing rank 1 now"
    finally:
        wakeup.close()


def test_a_signal_during_a_failures_stop_ends_the_run_instead_of_restarting(tmp_path):
    """Ctrl-C while the ranks of a failed round are being stopped: no restart is announced or slept, the signal
    is recorded, and the run ends with 130 (main went on to log a restart and ended without a signal event)."""
    world = build_world(tmp_path, ("max_restarts", 3))
    stop = world.group.stop

    def stop_then_ctrl_c(*args, **kwargs):
        stop(*args, **kwargs)
        world.wakeup.post_signal(signal.SIGINT)

    world.group.stop = stop_then_ctrl_c  # type: ignore[method-assign]
    assert world.run([exit_rank(0, 1)]) == 128 + signal.SIGINT
    assert world.events("restart") == [] and world.wakeup.sleeps == []
    assert [e["signal"] for e in world.events("signal")] == ["SIGINT"]
    assert "received SIGINT: while restarting; stopping" in world.said


def test_a_watched_signal_that_no_handler_sees_is_reported_and_other_signals_are_not():
    """``agent.wakeup.StuckSignals`` with real signals to this process: a watched signal whose Python handler runs is fine,
    an unwatched one (a terminal's SIGWINCH, say) is ignored, a watched one that the handler does not see
    (the main thread stuck in C code, here: a handler that does not count it) is reported."""
    import os
    import time

    from mbr_launch.agent.wakeup import StuckSignals

    seen, fired = [], []
    counted = {"on": True}

    def handler(signum, _frame):  # counts the watched signal, as Wakeup.post_signal does
        if counted["on"] and signum == signal.SIGUSR1:
            seen.append(signum)

    old = {sig: signal.signal(sig, handler) for sig in (signal.SIGUSR1, signal.SIGUSR2)}
    stuck = StuckSignals([signal.SIGUSR1], lambda: len(seen), fired.append, patience=0.3).start()
    try:
        os.kill(os.getpid(), signal.SIGUSR2)  # not watched
        os.kill(os.getpid(), signal.SIGUSR1)  # watched, and its handler runs
        time.sleep(0.8)
        assert fired == [] and seen == [signal.SIGUSR1]
        counted["on"] = False  # from now on the handler "does not run"
        os.kill(os.getpid(), signal.SIGUSR1)
        deadline = time.monotonic() + 5
        while not fired and time.monotonic() < deadline:
            time.sleep(0.05)
        assert fired == [signal.SIGUSR1]
    finally:
        stuck.close()
        for sig, previous in old.items():
            signal.signal(sig, previous)


def test_a_handler_that_ran_once_for_two_signals_is_not_taken_for_a_stuck_main_thread():
    """CPython runs a handler once for a signal that came twice before it ran (a Ctrl-C to the launcher's
    process group while another is on its way): two bytes in the wakeup file, one handler run. The main thread
    is alive; the watchdog must not end the run (it did, under load, in test_waiting)."""
    import os
    import time

    from mbr_launch.agent.wakeup import StuckSignals

    runs, fired = [], []

    def handler(signum, _frame):  # counts the first SIGUSR1 only: the second "coalesced" into it
        if not runs:
            runs.append(signum)

    old = signal.signal(signal.SIGUSR1, handler)
    stuck = StuckSignals([signal.SIGUSR1], lambda: len(runs), fired.append, patience=0.3).start()
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(1.2)
        assert runs == [signal.SIGUSR1] and fired == []
    finally:
        stuck.close()
        signal.signal(signal.SIGUSR1, old)


def test_outside_a_store_call_one_unseen_signal_waits_the_long_patience_and_a_second_one_acts():
    """A main thread slow in C code that returns (a large extension module loading on a loaded machine) is not
    stuck: one unseen Ctrl-C there waits ``long_patience`` before the watchdog ends the run (it cut a 20 s stop
    grace to nothing in CI); a second unseen one acts after ``patience``, as it does inside a store call. Each
    watched signal nudges the main loop, which another thread's delivery would not wake."""
    import contextlib
    import os
    import time

    from mbr_launch.agent.wakeup import StuckSignals

    fired, nudges = [], []

    @contextlib.contextmanager
    def watchdog(blocked_in, long_patience):
        fired.clear()
        stuck = StuckSignals([signal.SIGUSR1], lambda: 0, fired.append, blocked_in=lambda: blocked_in,
                             nudge=lambda: nudges.append(1), patience=0.3, long_patience=long_patience).start()
        try:
            yield
        finally:
            stuck.close()

    def fires_within(seconds: float) -> list[int]:
        deadline = time.monotonic() + seconds
        while not fired and time.monotonic() < deadline:
            time.sleep(0.05)
        return fired

    old = signal.signal(signal.SIGUSR1, lambda _signum, _frame: None)  # never counted: "not run"
    try:
        with watchdog(None, 60):
            os.kill(os.getpid(), signal.SIGUSR1)
            time.sleep(1.2)
            assert fired == [] and nudges, "one unseen signal outside a store call waits the long patience"
            os.kill(os.getpid(), signal.SIGUSR1)
            assert fires_within(10) == [signal.SIGUSR1]
        with watchdog(None, 1.0):
            os.kill(os.getpid(), signal.SIGUSR1)
            assert fires_within(15) == [signal.SIGUSR1], "the long patience ends too"
        with watchdog("joining the rendezvous", 60):
            os.kill(os.getpid(), signal.SIGUSR1)
            assert fires_within(15) == [signal.SIGUSR1], "inside a store call one unseen signal acts after the patience"
    finally:
        signal.signal(signal.SIGUSR1, old)
