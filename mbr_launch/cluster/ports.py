"""The fresh MASTER_PORT each round's workers get, with the two ports above it free as well.

NVRx in-process restart puts the application's store on ``MASTER_PORT + 1`` and its wrapper's on ``+ 2`` (NVRx's
and Megatron-LM's examples), and a taken one fails the job at start (docs/in-process-restart.md).
"""

from __future__ import annotations

import random
import socket
from typing import Callable, Iterable

SPAN = 3  # MASTER_PORT, +1 (application store), +2 (in-process restart wrapper's store)


def span_free(port: int, span: int = SPAN) -> bool:
    """Whether ``port`` .. ``port + span - 1`` can all be bound on every interface right now."""
    if port + span - 1 > 65535:
        return False
    sockets: list[socket.socket] = []
    try:
        for p in range(port, port + span):
            sock = socket.socket()
            sockets.append(sock)
            sock.bind(("", p))
        return True
    except OSError:
        return False
    finally:
        for sock in sockets:
            sock.close()


def ephemeral_range() -> tuple[int, int]:
    try:
        low, high = (int(x) for x in open("/proc/sys/net/ipv4/ip_local_port_range").read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def _candidates() -> range:
    # Outside the kernel's ephemeral range, so no outgoing connection (NCCL opens many) takes a port between
    # the pick and rank 0's bind; the last SPAN - 1 ports below the range are left out so the span stays below.
    low, high = ephemeral_range()
    below = range(10000, low - (SPAN - 1))
    return below if low > 11000 else range(high + 1, 65536 - (SPAN - 1)) or range(20000, 30000)


def pick_master_port(attempts: int = 64, *, candidates: Iterable[int] | None = None,
                     free: Callable[[int], bool] = span_free) -> int:
    """A port ``p`` with ``p``, ``p + 1`` and ``p + 2`` free, outside the ephemeral range when possible."""
    pool = list(_candidates() if candidates is None else candidates)
    for port in random.sample(pool, min(attempts, len(pool))):
        if free(port):
            return port
    for _ in range(attempts):  # everything sampled was taken: ask the kernel, then check the two above
        with socket.socket() as sock:
            sock.bind(("", 0))
            port = sock.getsockname()[1]
        if free(port):
            return port
    raise OSError(f"no {SPAN} consecutive free ports found for MASTER_PORT after {2 * attempts} tries")
