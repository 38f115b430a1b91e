"""A rendezvous store that trains nothing: ``mbr-launch store`` serves torch's c10d store from a host of its own.

Served apart, the store outlives any training node (docs/slurm.md). Multi-tenant, on a socket from
``cluster.listen``.
"""

from __future__ import annotations

import datetime
import signal
import socket
from dataclasses import dataclass
from typing import Callable

from mbr_launch.cluster import listen

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class StoreServeError(Exception):
    """The store cannot be served (the port is taken, torch refused): one line that says what to do."""


@dataclass(frozen=True)
class Served:
    host: str  # what agents should put in --rdzv-endpoint
    port: int
    signal: str  # what stopped it


def _say(line: str) -> None:
    print(line, flush=True)  # at once, also into a file: whoever started the store waits for this line


def serve(port: int, *, host: str = "", say: Callable[[str], None] = _say,
          wait: Callable[[], int] | None = None) -> Served:
    """Serve the store on ``port`` until a stop signal (or ``wait`` returns one); the store dies with this
    process. ``host``: the name agents use to reach it (default: this machine's name)."""
    from torch.distributed import TCPStore

    name = host or socket.getfqdn()
    fd = listen.listening_fd(port, name)
    if fd is None:
        raise StoreServeError(f"cannot serve the rendezvous store: port {port} is taken on this host (another "
                              "store, or another program): pick a free one with --port")
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)  # taken by sigwait, never half-handled
    try:
        try:
            store = TCPStore(name, port, is_master=True, multi_tenant=True, wait_for_workers=False,
                             timeout=datetime.timedelta(seconds=60), master_listen_fd=fd)
        except (TypeError, ValueError, RuntimeError) as err:
            listen.close_fd(fd)
            raise StoreServeError(f"cannot serve the rendezvous store on port {port}: {err}") from None
        say(f"mbr-launch store: serving the c10d rendezvous store on port {port}; start each node's agent with "
            f"--rdzv-backend c10d --rdzv-endpoint {name}:{port} and its own --rdzv-id per job "
            "(SIGTERM or Ctrl-C stops the store)")
        got = wait() if wait is not None else signal.sigwait(STOP_SIGNALS)
        del store  # the server thread stops with it
        return Served(name, port, signal.Signals(got).name)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
