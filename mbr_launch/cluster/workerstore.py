"""The workers' store of one round, served by group rank 0's agent on the round's fresh MASTER_PORT.

A new, empty store every round, listening (our socket) before the workers start: served by global rank 0,
early ranks meet a closed port and back off; torchrun's shared store breaks restarts (pytorch#135712). The port
is picked with ``+ 1`` and ``+ 2`` free for NVRx in-process restart (docs/in-process-restart.md).

A static rendezvous keeps the static store as the workers' store, as torchrun does, so group rank 0's agent
deletes the workers' keys between rounds (``round_port``): a restarted attempt would read the dead one's.
"""

from __future__ import annotations

import datetime
import random
import socket
import threading
from typing import Any, Callable, Iterable

from mbr_launch.cluster import listen


SPAN = 3  # MASTER_PORT, +1 (application store), +2 (in-process restart wrapper's store)


def span_free(port: int, span: int = SPAN) -> bool:
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


class ServedStore:
    """The round's worker store, made in a thread so torch's slow constructor does not hold up this node's
    ranks (the kernel queues them). Dropping the handle drops the store."""

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
        self._thread.join(timeout)
        return self.store is not None


def serve(master_addr: str, port: int, *, timeout: float = 300.0) -> ServedStore | None:
    try:
        import torch.distributed  # noqa: F401 - only check that the store can be made here at all
    except Exception:
        return None
    # Workers told to reach it at a loopback name can only come from this machine: listen there only.
    fd = listen.listening_fd(port, master_addr, loopback=listen.is_loopback(master_addr or "localhost"))
    if fd is None:
        return None
    return ServedStore(master_addr or "localhost", port, fd, datetime.timedelta(seconds=timeout))


# ---- the static rendezvous: its store is the workers' (issue #38) ----------------------------------------

AGENT_PREFIX = "mbr/"  # every key of ours on the raw store (job keys, round control, layout)


class NotClearable(RuntimeError):
    """The static store cannot list its keys (a torch without ``Store.list_keys``): says what to do."""


def static_addr(endpoint: str) -> str:
    """The workers' MASTER_ADDR for a static rendezvous: the endpoint's host as given (torch compares text)."""
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

    return parse_rendezvous_endpoint(endpoint, default_port=-1)[0]


def agent_prefixes(run_id: str) -> tuple[str, ...]:
    return AGENT_PREFIX, f"{run_id}/", f"torch.rendezvous.{run_id}"


def clear_worker_keys(store: Any, keep: tuple[str, ...]) -> int:
    try:
        keys = store.list_keys()
    except (AttributeError, RuntimeError) as err:  # RuntimeError: a store type that does not list (torch says so)
        raise NotClearable(f"the static store cannot list the workers' keys to clear them between rounds ({err}); "
                           "use --rdzv-backend c10d, or a torch whose TCPStore has list_keys") from None
    deleted = 0
    for key in keys:
        if isinstance(key, str) and not key.startswith(keep) and store.delete_key(key):
            deleted += 1
    return deleted


def round_port(store: Any, run_id: str) -> int:
    """Group rank 0's MASTER_PORT on the static store: its own port, once the previous workers' keys are gone."""
    clear_worker_keys(store, agent_prefixes(run_id))
    return int(store.port)
