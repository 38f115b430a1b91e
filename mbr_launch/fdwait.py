"""Waiting for descriptors to be ready: ``poll(2)``, never ``select(2)``; standard library only.

``select`` refuses descriptor numbers from 1024 up (FD_SETSIZE), and an agent gets there: the agent that hosts
the rendezvous store holds a descriptor for every connection of every agent (256 agents on one machine: the
store's host ended with "filedescriptor out of range in select()" in its restart round, exit 4), so the pidfds
and pipes it opens after that are numbered above 1024, and a standby keeps its channel's number from the agent.
``poll`` takes any number. Used by the agent, the workers' code and the shim (``shim`` may import this module).
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
