"""A last-resort bound on store calls that can block forever.

torch's client never times out on a dropped connection. A call in ``guard.around(...)`` that outlasts its
bound makes a watchdog run ``on_expire``, which ends the process. A bound passing while ``alive()`` (the
store's host runs here) is given again: loopback cannot be cut.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Callable, Iterator


def wait_timed_out() -> type[BaseException]:
    """The error of a store ``wait`` that timed out (no lost store); imported late, as torch is."""
    from torch.distributed import DistStoreError

    return DistStoreError


class StoreUnreachable(Exception):
    """A store call failed because the store is gone; the supervisor ends the run with exit 3 and one line."""

    def __init__(self, what: str, error: BaseException) -> None:
        super().__init__(f"{what}: {type(error).__name__}: {error}")
        self.what, self.error = what, error


def store_errors() -> tuple[type[BaseException], ...]:
    """What torch raises when the store cannot be reached (imported late: this module loads before torch)."""
    from torch.distributed import DistError
    from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError, RendezvousStateError

    return DistError, RendezvousConnectionError, RendezvousStateError, ConnectionError, TimeoutError


class StoreGuard:
    def __init__(self, on_expire: Callable[[str, float], None], *, clock: Callable[[], float] = time.monotonic,
                 tick: float = 0.25, alive: Callable[[], bool] = lambda: False) -> None:
        self._on_expire = on_expire
        self._clock = clock
        self._alive = alive
        self._tick = tick
        self._lock = threading.Lock()
        self._deadline: float | None = None
        self._what = ""
        self._started = 0.0
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="store-guard", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._closed.set()
        if self._thread.is_alive():
            self._thread.join(self._tick * 4)

    def blocked_in(self) -> str | None:
        with self._lock:
            return self._what if self._deadline is not None else None

    @contextlib.contextmanager
    def around(self, seconds: float, what: str) -> Iterator[None]:
        with self._lock:
            outer = (self._deadline, self._what, self._started)
            now = self._clock()
            self._deadline, self._what, self._started = now + seconds, what, now
        try:
            yield
        finally:
            with self._lock:
                self._deadline, self._what, self._started = outer

    def _run(self) -> None:
        while not self._closed.wait(self._tick):
            with self._lock:
                deadline, what, started = self._deadline, self._what, self._started
            now = self._clock()
            if deadline is None or now <= deadline:
                continue
            if self._alive():
                with self._lock:
                    if self._deadline == deadline:  # the same call: its bound again, from now
                        self._deadline = now + (deadline - started)
                continue
            self._on_expire(what, now - started)
            return
