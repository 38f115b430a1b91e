"""One admitted membership of the rendezvous (``Round``); torch-free at import, so modules loaded before torch
(the standby pool) can name its type."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mbr_launch.cluster import storeclients
from mbr_launch.cluster.storevalue import Sealer

if TYPE_CHECKING:  # torch's store types, for annotations only: importing torch is what this module avoids
    from torch.distributed import Store


@dataclass(frozen=True)
class Round:
    index: int  # this agent's count of rounds joined (0, 1, ...)
    group_rank: int
    group_world_size: int
    world_size: int
    rank_offset: int  # global rank of this node's local rank 0
    master_addr: str
    master_port: int
    restart_count: int  # job-wide failures so far (the same on every node)
    token: str  # unique per round; prefixes the job-level control keys
    store: Store  # the round's coordination store (torch's, round-prefixed)
    control: Store  # keys of this round's control messages (stop, done), on our own prefix
    control_prefix: str
    store_host: str  # the rendezvous TCPStore, for extra client connections (watchers)
    store_port: int
    fast: bool = False  # agreed through the fast path (``cluster.fastround``), not a c10d join
    fallback: str | None = None  # why a fast path that was tried (or skipped) gave way to the c10d join
    woken: bool = False  # the c10d join learnt of its round's completion from the completer (joining)
    shared_store: bool = False  # the workers' store is the static rendezvous store itself (cluster.workerstore)
    # The job's sealer (``cluster.jobstore``): the round's control keys are sealed and verified with it.
    sealer: Sealer = field(default_factory=Sealer, compare=False, repr=False)

    def connect_control(self, timeout: float = 30.0) -> Store:
        """A connection of the calling thread's own to this round's control keys, pooled or new
        (``rendezvous.release_control`` gives it back)."""
        from torch.distributed import PrefixStore  # a round exists only once torch has made its stores

        return PrefixStore(self.control_prefix, storeclients.POOL.acquire(self.store_host, self.store_port, timeout))
