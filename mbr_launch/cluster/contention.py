"""Backing off after a lost write of torch's rendezvous state: the cause of the "5 s join steps" (issue #18).

torch's c10d rendezvous keeps the whole state (every node, its heartbeat) in one store key and changes it by
compare-and-set. A node whose write loses (another node wrote first) gets the new state back and retries at
once. When N nodes write at the same moment, each generation of retries has exactly one winner and N-1 losers
that unpickle, re-decide, re-pickle and send the state again straight away: O(N) wasted CPU and bytes per
winner, O(N^2) for the N writes, and on a loaded machine every retry waits for a CPU. Nodes write at the same
moment after a failure (our stop message reaches every agent within a poll, so they all leave the old round
together) and, worse, every keep-alive interval: every agent's keep-alive timer was started when the round
formed, so all N fire in lockstep. A keep-alive that keeps losing for its 5 s deadline lets the node's
heartbeat age until others declare it dead and drop it; it must then join again, and a join waiting for all
N nodes completes only after one of the next storms: the 5 s steps measured with 32 agents on 2 cores
(benchmarks/RESULTS.md).

``install`` wraps the state holder that torch's operation executor writes through: after a lost write, the
node sleeps a random time in [0, cap] before it retries, cap doubling from ``FIRST`` to ``CAP`` with each
further loss (reset by a won write). The winner of each generation then usually writes unopposed. Private
torch attributes; when missing, nothing is wrapped.
"""

from __future__ import annotations

import random
import time
from typing import Any, Callable

FIRST = 0.01  # seconds: the first back-off's cap (a few store round trips plus a state's pickling)
CAP = 0.32  # seconds: reached after 5 losses in a row; well under torch's 1 s state poll


def install(handler: Any, *, sleep: Callable[[float], None] = time.sleep) -> bool:
    executor = getattr(handler, "_op_executor", None)
    executor = getattr(executor, "_inner", executor)  # under cluster.shrink's wrapper
    holder = getattr(executor, "_state_holder", None)
    if holder is None or not hasattr(holder, "sync"):
        return False
    executor._state_holder = BackOff(holder, sleep=sleep)
    return True


class BackOff:
    """torch's state holder, sleeping a growing random time after each lost write."""

    def __init__(self, inner: Any, *, sleep: Callable[[float], None] = time.sleep,
                 rand: Callable[[float, float], float] = random.uniform) -> None:
        self._inner, self._sleep, self._rand = inner, sleep, rand
        self.losses = 0

    def sync(self) -> Any:
        won = self._inner.sync()
        if won is False:  # None: a plain read; True: our write landed
            # The lost write brought the latest state back (compare_set answers with it); a retry decided on
            # it after the pause usually lands, since the others pause too.
            self._sleep(self._rand(0.0, min(CAP, FIRST * 2 ** self.losses)))
            self.losses += 1
        elif won:
            self.losses = 0
        return won

    @property
    def state(self) -> Any:
        return self._inner.state

    def mark_dirty(self) -> None:
        self._inner.mark_dirty()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

