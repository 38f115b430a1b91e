"""The workers' store of one round, served by group rank 0's agent on the round's fresh MASTER_PORT.

When global rank 0 serves it itself (``TORCHELASTIC_USE_AGENT_STORE=False``), every other rank that starts
first meets a closed port, and torch's store client then backs off for about a second before it tries again
(measured: 0.75 s for a server 50 ms late; 2.4 s under load). Warm standbys start every rank within
milliseconds, so that back-off was most of a restart. torchrun avoids it by handing the workers its own
rendezvous store, which outlives rounds and breaks restarts (pytorch#135712). Here the agent starts a new,
empty store for every round before it starts the workers (``TORCHELASTIC_USE_AGENT_STORE=True``: every rank
is a client), and drops it when the next round begins: no key of an earlier round can be read.

The listening socket is ours, bound and listening before torch's server gets it (``master_listen_fd``): the
store's own client, which torch connects from inside the constructor, then never meets a port that torch's
server thread has not opened yet. Under load it did (32 agents on 2 cores: the constructor took 5 s of
connect back-offs, and every rank of the round started that much later).
"""

from __future__ import annotations

import datetime
import os
import socket
from typing import Any


def serve(master_addr: str, port: int, *, timeout: float = 300.0) -> Any | None:
    """A listening store on ``port``, or None when it cannot bind (global rank 0 then serves it, as before)."""
    try:
        from torch.distributed import TCPStore
    except Exception:
        return None
    host, delta = master_addr or "localhost", datetime.timedelta(seconds=timeout)
    fd = _listening_fd(port)
    if fd is not None:
        try:
            return TCPStore(host, port, is_master=True, wait_for_workers=False, timeout=delta, master_listen_fd=fd)
        except Exception:
            _close(fd)  # a torch without master_listen_fd (or that refused the socket): its own bind below
    try:
        return TCPStore(host, port, is_master=True, wait_for_workers=False, timeout=delta)
    except Exception:
        return None


def _listening_fd(port: int) -> int | None:
    """A socket listening on ``port`` on every address (IPv6 with IPv4 mapped where there is IPv6, as torch's
    own server binds), handed over as a bare descriptor: the store owns and closes it from then on."""
    for family, address in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind((address, port))
            sock.listen(socket.SOMAXCONN)
            sock.set_inheritable(False)
            return sock.detach()
        except OSError:
            sock.close()
    return None


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass
