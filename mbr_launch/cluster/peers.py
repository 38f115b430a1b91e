"""Noticing peers that vanish, within a bounded window, instead of waiting for NCCL (pytorch#111646).

Each agent bumps a counter in the round's control keys every ``interval``. Group rank 0 watches every
peer's counter; the others watch rank 0's. A counter that has not moved for ``timeout`` seconds (measured
on the watcher's own monotonic clock, so clocks need not agree) means that agent is dead or cut off.
O(N) store traffic per interval, not O(N^2).

When the store itself stops answering for ``timeout`` seconds, this node has lost the rendezvous host (or
its own network). A store call on a connection whose packets are dropped never returns (torch's client does
not time out there), so the verdict cannot come from this thread: it records when the store last answered
(``silent_for``) and the agent's loop compares that with the timeout.

The same thread also asks the rendezvous whether nodes wait to join (``membership``), so that no blocking
store call happens in the agent's main loop.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Union

from mbr_launch.cluster.rendezvous import release_control
from mbr_launch.cluster.round import Round


@dataclass(frozen=True)
class PeerLost:
    """The agent of ``group_rank`` has been silent for ``silent_for`` seconds: dead or cut off."""

    group_rank: int
    silent_for: float

    def describe(self) -> str:
        return f"the agent of group rank {self.group_rank} has been silent for {self.silent_for} s (dead or cut off)"


@dataclass(frozen=True)
class StoreLost:
    """The rendezvous store stopped answering this node: it may be cut off."""

    detail: str

    def describe(self) -> str:
        return self.detail


Silence = Union[PeerLost, StoreLost]


class PeerWatch:
    def __init__(self, rnd: Round, *, timeout: float, on_lost: Callable[[Silence], None],
                 waiting: Callable[[], int] | None = None, on_waiting: Callable[[int], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._round = rnd
        self._timeout = timeout
        self._interval = max(0.05, timeout / 4)
        self._on_lost = on_lost
        self._waiting = waiting
        self._on_waiting = on_waiting
        self._clock = clock
        self.last_ok = clock()  # when the store last answered this thread
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"peer-watch-{rnd.index}", daemon=True)

    def start(self) -> None:
        if self._round.group_world_size > 1 or self._waiting is not None:
            self._thread.start()

    def silent_for(self) -> float:
        """Seconds since the store last answered (0 when there is nothing to watch)."""
        if not self._thread.is_alive():
            return 0.0
        return self._clock() - self.last_ok

    def cancel(self) -> None:
        self._stop.set()

    def join(self, timeout: float) -> None:
        if self._thread.is_alive():
            self._thread.join(timeout)

    def watched(self) -> list[int]:
        me, size = self._round.group_rank, self._round.group_world_size
        return [r for r in range(size) if r != me] if me == 0 else [0]

    def _connect(self) -> Any:
        """A control connection, retried until the store has been unreachable for ``timeout``: a store host
        that is slow to accept (many agents connecting at once on a loaded machine reset or time out some
        connections) is not a lost store."""
        while not self._stop.is_set():
            left = self._timeout - (self._clock() - self.last_ok)
            try:
                store = self._round.connect_control(timeout=max(1.0, left))
                self.last_ok = self._clock()
                return store
            except Exception as err:
                if self._clock() - self.last_ok >= self._timeout:
                    self._on_lost(StoreLost(f"cannot reach the rendezvous store at {self._round.store_host}:"
                                            f"{self._round.store_port} for {self._clock() - self.last_ok:.1f} s: {err}"))
                    return None
                self._stop.wait(self._interval)
        return None

    def _run(self) -> None:
        store = self._connect()
        if store is None:
            return
        if self._watch(store):
            release_control(store)  # stopped with the round, its last operation answered: the next round's

    def _watch(self, store: Any) -> bool:
        """Watch until stopped (True) or a peer or the store is lost (False)."""
        keys = [f"hb/{r}" for r in self.watched()]
        answered = True
        try:
            for key in keys:
                store.add(key, 0)  # create missing counters so multi_get never blocks on a late peer
        except Exception:
            answered = False
        last: dict[str, tuple[bytes, float]] = {}
        store_ok_at = self.last_ok
        own = f"hb/{self._round.group_rank}"
        while not self._stop.wait(self._interval):
            now = self._clock()
            try:
                store.add(own, 1)
                values = store.multi_get(keys) if keys else []
                store_ok_at = self.last_ok = self._clock()
                answered = True
                if self._waiting is not None and self._on_waiting is not None:
                    count = self._waiting()
                    if count > 0:
                        self._on_waiting(count)
            except Exception as err:
                answered = False
                if now - store_ok_at >= self._timeout:
                    self._on_lost(StoreLost(f"the rendezvous store at {self._round.store_host}:"
                                            f"{self._round.store_port} has not answered for {now - store_ok_at:.1f} s "
                                            f"({type(err).__name__})"))
                    return False
                continue
            for key, value in zip(keys, values):
                seen = last.get(key)
                if seen is None or seen[0] != value:
                    last[key] = (value, now)
                elif now - seen[1] >= self._timeout:
                    self._on_lost(PeerLost(group_rank=int(key.split("/")[1]), silent_for=round(now - seen[1], 2)))
                    return False
        return answered
