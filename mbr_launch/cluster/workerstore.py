"""The workers' store of one round, served by group rank 0's agent on the round's fresh MASTER_PORT.

When global rank 0 serves it itself (``TORCHELASTIC_USE_AGENT_STORE=False``), every other rank that starts
first meets a closed port, and torch's store client then backs off for about a second before it tries again
(measured: 0.75 s for a server 50 ms late; 2.4 s under load). Warm standbys start every rank within
milliseconds, so that back-off was most of a restart. torchrun avoids it by handing the workers its own
rendezvous store, which outlives rounds and breaks restarts (pytorch#135712). Here the agent starts a new,
empty store for every round before it starts the workers (``TORCHELASTIC_USE_AGENT_STORE=True``: every rank
is a client), and drops it when the next round begins: no key of an earlier round can be read.

The listening socket is ours, bound and listening before torch's server gets it (``master_listen_fd``; IPv4
when the master address is IPv4 only, ``cluster.listen`` says why), and torch's constructor runs in a thread
(``ServedStore``): ranks that connect before it is done wait in the kernel's queue, not in torch's connect
back-off.
"""

from __future__ import annotations

import datetime
import threading
from typing import Any

from mbr_launch.cluster import listen


class ServedStore:
    """The round's worker store, made in a thread of its own. The socket listens before this returns, so a
    rank that connects at once is queued by the kernel until torch's server serves it; torch's constructor,
    which took 5 to 10 s for group rank 0's agent of 32 on 2 cores (while the same call took 0.03 s in the
    next round), no longer holds up the start of this node's ranks. Dropping the handle drops the store (a
    store still being made is dropped when its thread ends)."""

    def __init__(self, host: str, port: int, fd: int, timeout: datetime.timedelta) -> None:
        self.store: Any = None
        self.failed: str | None = None
        self._thread = threading.Thread(target=self._make, args=(host, port, fd, timeout), daemon=True,
                                        name="worker-store")
        self._thread.start()

    def _make(self, host: str, port: int, fd: int, timeout: datetime.timedelta) -> None:
        from torch.distributed import TCPStore

        try:
            self.store = TCPStore(host, port, is_master=True, wait_for_workers=False, timeout=timeout,
                                  master_listen_fd=fd)
            return
        except Exception:
            listen.close_fd(fd)  # a torch without master_listen_fd (or that refused the socket): its own bind below
        try:
            self.store = TCPStore(host, port, is_master=True, wait_for_workers=False, timeout=timeout)
        except Exception as err:
            self.failed = f"{type(err).__name__}: {err}"

    def ready(self, timeout: float) -> bool:
        """Whether the store was made within ``timeout`` seconds (for tests and diagnostics)."""
        self._thread.join(timeout)
        return self.store is not None


def serve(master_addr: str, port: int, *, timeout: float = 300.0) -> ServedStore | None:
    """A store for the round's workers on ``port``, served by this agent; None when the port cannot be bound
    (global rank 0 then serves it, as before)."""
    try:
        import torch.distributed  # noqa: F401 - only check that the store can be made here at all
    except Exception:
        return None
    # Workers told to reach it at a loopback name can only come from this machine: listen there only.
    fd = listen.listening_fd(port, master_addr, loopback=listen.is_loopback(master_addr or "localhost"))
    if fd is None:
        return None
    return ServedStore(master_addr or "localhost", port, fd, datetime.timedelta(seconds=timeout))

