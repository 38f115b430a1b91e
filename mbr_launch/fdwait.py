"""Waiting for descriptors to be ready: ``poll(2)``, never ``select(2)``; standard library only.

``select`` refuses descriptor numbers from 1024 up (FD_SETSIZE), and the agent that hosts the rendezvous store
gets there (a descriptor per connection of every agent). Used by the agent, the workers' code and the shim.
"""

from __future__ import annotations

import select
from collections.abc import Sequence


def ready(fds: Sequence[int], timeout: float | None, *, write: bool = False) -> list[int]:
    """The descriptors of ``fds`` ready to read (to write with ``write``), after at most ``timeout`` seconds
    (None: no limit). A descriptor whose other end is gone (hang-up, error) counts as ready, as with select."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLOUT if write else select.POLLIN)
    wait = None if timeout is None else max(0.0, timeout) * 1000.0
    return [fd for fd, _ in poller.poll(wait)]
