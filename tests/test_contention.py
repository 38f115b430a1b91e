"""cluster.contention: after a lost write of torch's rendezvous state, a growing random sleep before the retry
(nothing after a won write or a plain read)."""

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

