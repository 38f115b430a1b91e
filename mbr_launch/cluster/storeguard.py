"""A last-resort bound on store calls that can block forever.

torch's TCPStore client does not time out on a connection whose packets are silently dropped (a node cut
off from the network): a blocking call in the agent's main thread would then hang the agent, and its
workers with it. The agent wraps its store calls in ``guard.around(...)``; if one takes longer than its
bound, a watchdog thread runs ``on_expire`` (which stops the workers and ends the process): nothing can
unblock the stuck thread, but nothing of ours outlives it either.

Bounds run on the agent's own time (``cluster.hostview.own_time``: a process starved of CPU counts less of
it), and a bound that passes while ``alive()`` says the store's host runs on this machine is given again: the
call is slow there, and loopback cannot be cut (issue #38).
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Callable, Iterator


def wait_timed_out() -> type[BaseException]:
    """The error of a store ``wait`` that timed out, which is no lost store (imported late: the modules that
    use it load before torch)."""
    from torch.distributed import DistStoreError

    return DistStoreError


class StoreUnreachable(Exception):
    """A store call failed because the store is gone (its host's agent died, its link broke): what the call
    was for and torch's error. The supervisor ends the run with exit 3 and one line, never "internal error"."""

    def __init__(self, what: str, error: BaseException) -> None:
        super().__init__(f"{what}: {type(error).__name__}: {error}")
        self.what, self.error = what, error


def store_errors() -> tuple[type[BaseException], ...]:
    """What torch raises when the store cannot be reached: its DistError family (DistNetworkError "Broken
    pipe", "Failed to recv", DistStoreError timeouts), the elastic rendezvous' connection and state errors,
    and the socket errors under them. Imported late: this module loads before torch."""
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
        """What the guarded call now running is (``what`` of the innermost ``around``); None outside one."""
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
