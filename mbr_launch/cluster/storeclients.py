"""Client connections to the rendezvous store for the watcher threads, kept from one round to the next.

Each new connection costs a reverse DNS lookup on both sides (``cluster.listen``), and every agent opening
them at once stalled the store; so a released one serves the next round's watcher, and the first round's
are opened while the agent waits to join (``prefill``).
"""

from __future__ import annotations

import datetime
import threading
from typing import Any

# Idle connections kept per store: a round's watchers plus the previous round's, still finishing their last
# one-second wait when the next round's watchers start.
KEEP = 8


class ClientPool:
    def __init__(self) -> None:
        self._idle: dict[tuple[str, int], list[Any]] = {}
        self._lock = threading.Lock()

    def acquire(self, host: str, port: int, timeout: float) -> Any:
        client = self.take_idle(host, port)
        if client is not None:
            client.set_timeout(datetime.timedelta(seconds=timeout))
            return client
        return _connect(host, port, timeout)

    def take_idle(self, host: str, port: int) -> Any | None:
        """An idle client of ``host:port`` if there is one (never a new connection); ``release`` it after."""
        with self._lock:
            idle = self._idle.get((host, port))
            return idle.pop() if idle else None

    def release(self, client: Any) -> None:
        """Give back a client whose last operation worked (a broken one is dropped by not releasing it)."""
        key = (getattr(client, "host", ""), int(getattr(client, "port", 0)))
        with self._lock:
            idle = self._idle.setdefault(key, [])
            if len(idle) < KEEP and client not in idle:
                idle.append(client)

    def prefill(self, host: str, port: int, count: int, timeout: float = 60.0) -> threading.Thread:
        def fill() -> None:
            try:
                while self.idle(host, port) < min(count, KEEP):
                    self.release(_connect(host, port, timeout))
            except Exception:
                pass  # the store is not there (yet): each watcher opens its own in ``acquire``

        thread = threading.Thread(target=fill, daemon=True, name="store-connections")
        thread.start()
        return thread

    def idle(self, host: str, port: int) -> int:
        with self._lock:
            return len(self._idle.get((host, port), ()))


def _connect(host: str, port: int, timeout: float) -> Any:
    from torch.distributed import TCPStore

    return TCPStore(host, port, is_master=False, wait_for_workers=False,
                    timeout=datetime.timedelta(seconds=timeout))


POOL = ClientPool()
