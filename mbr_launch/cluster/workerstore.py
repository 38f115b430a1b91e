"""The workers' store of one round, served by group rank 0's agent on the round's fresh MASTER_PORT.

When global rank 0 serves it itself (``TORCHELASTIC_USE_AGENT_STORE=False``), every other rank that starts
first meets a closed port, and torch's store client then backs off for about a second before it tries again
(0.75 s for a server 50 ms late; 2.4 s under load): most of a restart with warm standbys. torchrun hands the
workers its own rendezvous store instead, which outlives rounds and breaks restarts (pytorch#135712). Here the
agent starts a new, empty store for every round before it starts the workers (every rank is a client), and
drops it when the next round begins: no key of an earlier round can be read. Its listening socket is ours,
listening before torch's server gets it (``master_listen_fd``; ``cluster.listen``), and torch's constructor
runs in a thread (``ServedStore``): ranks that connect early wait in the kernel's queue, not in a back-off.

A static rendezvous (``--master-addr``/``--master-port``, or ``--rdzv-backend static`` with an endpoint) is
different: torchrun gives its workers that endpoint as ``MASTER_ADDR:MASTER_PORT``, and torch 2.14 makes rank 0
listen on a ``tcp://`` init at the static port with another ``MASTER_PORT`` (EADDRINUSE on the agent's port;
``torch.distributed.rendezvous._agent_store_serves``). So there the static store is the workers' store, as
under torchrun (``round_port``). torchrun leaves every attempt's worker keys in it, so a restarted attempt may
read gloo's rank addresses of the dead one and retry them until its init times out (pytorch#135712; under
torchrun 2.13, 5 of 6 runs with one failure did not restart cleanly). Here group rank 0's agent deletes every
key the workers wrote before the next round's workers start: every node has stopped its workers by then, and
none has started new ones (they wait for the layout group rank 0 publishes after this). The agents' own keys
lie under ``mbr/``, torch's static handler's ``<run id>/`` and ``torch.rendezvous.<run id>``.
"""

from __future__ import annotations

import datetime
import threading
from typing import Any

from mbr_launch.cluster import listen


class ServedStore:
    """The round's worker store, made in a thread of its own: torch's constructor (5 to 10 s for group rank 0's
    agent of 32 on 2 cores) does not hold up the start of this node's ranks, which the kernel queues meanwhile.
    Dropping the handle drops the store (one still being made, when its thread ends)."""

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
    (the workers then make it themselves: global rank 0 serves it)."""
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
    """The workers' MASTER_ADDR for a static rendezvous: the endpoint's host as given, as torchrun passes it
    (torch 2.14 compares it with the init method's host as text)."""
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

    return parse_rendezvous_endpoint(endpoint, default_port=-1)[0]


def agent_prefixes(run_id: str) -> tuple[str, ...]:
    """Key prefixes of the agents on the static store: ours, torch's static handler's (its run id), and the
    c10d state key that the agent's readers of torch's rendezvous state (``cluster.joining``) leave there."""
    return AGENT_PREFIX, f"{run_id}/", f"torch.rendezvous.{run_id}"


def clear_worker_keys(store: Any, keep: tuple[str, ...]) -> int:
    """Delete every key of ``store`` (the raw TCPStore, no prefix) that starts with none of ``keep``; returns
    how many were deleted."""
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
    """Group rank 0's MASTER_PORT for a round on the static store ``store`` (raw): its own port, once the
    previous round's worker keys are gone."""
    clear_worker_keys(store, agent_prefixes(run_id))
    return int(store.port)
