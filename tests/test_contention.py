"""cluster.contention: after a lost write of torch's rendezvous state, a growing random sleep before the retry
(nothing after a won write or a plain read); keep-alive timers out of lockstep."""

from __future__ import annotations

from mbr_launch.cluster.contention import CAP, FIRST, BackOff


class Holder:
    """torch's state holder as BackOff sees it: sync() -> False (lost write), True (won), None (read)."""

    def __init__(self, results: list) -> None:
        self.results = results
        self.calls: list[float] = []  # _last_sync_time at each call (-1: the cache was bypassed)
        self._last_sync_time = 5.0
        self.state = "S"

    def sync(self):
        self.calls.append(self._last_sync_time)
        self._last_sync_time = 5.0
        return self.results.pop(0)


def _backoff(results: list) -> tuple[BackOff, Holder, list[float]]:
    slept: list[float] = []
    holder = Holder(results)
    return BackOff(holder, sleep=slept.append, rand=lambda lo, hi: hi), holder, slept


def test_lost_writes_sleep_longer_each_time():
    backoff, holder, slept = _backoff([False, False, False])
    assert [backoff.sync() for _ in range(3)] == [False, False, False]
    assert slept == [FIRST, FIRST * 2, FIRST * 4]
    assert len(holder.calls) == 3  # the lost write brought the state back: no extra read


def test_a_won_write_resets_and_reads_cost_nothing():
    backoff, holder, slept = _backoff([False, True, None, False])
    assert [backoff.sync() for _ in range(4)] == [False, True, None, False]
    assert slept == [FIRST, FIRST]  # reset by the win
    assert backoff.state == "S"


def test_the_sleep_is_capped():
    backoff, _holder, slept = _backoff([False] * 12)
    for _ in range(12):
        backoff.sync()
    assert max(slept) == CAP


def test_the_first_keep_alive_of_a_round_is_shifted_once_and_a_stop_cancels_it():
    import threading
    from datetime import timedelta
    from types import SimpleNamespace

    from mbr_launch.cluster.contention import spread_keep_alives

    sent: list[int] = []
    waits: list[float] = []

    class Stop(threading.Event):
        def wait(self, timeout=None):
            waits.append(timeout)
            return self.is_set()

    handler = SimpleNamespace(_keep_alive=lambda: sent.append(1), _settings=SimpleNamespace(
        keep_alive_interval=timedelta(seconds=4)), _keep_alive_timer=None)
    assert spread_keep_alives(handler, rand=lambda lo, hi: hi)
    handler._keep_alive_timer = SimpleNamespace(_ctx=SimpleNamespace(stop_event=Stop()))
    handler._keep_alive()
    handler._keep_alive()
    assert waits == [2.0] and sent == [1, 1]  # half an interval at most, only before the round's first
    stopped = Stop()
    stopped.set()
    handler._keep_alive_timer = SimpleNamespace(_ctx=SimpleNamespace(stop_event=stopped))  # the next round
    handler._keep_alive()
    assert sent == [1, 1]  # stopped while waiting: no keep-alive for a round that is over
