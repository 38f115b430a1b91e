"""A round's rank layout in O(1) store operations per agent.

Every node announces its number of workers; group rank 0 reads them in one ``multi_get`` and publishes one key
(token, restart count, master port, run-length encoded sizes: ``8x4096``) that the others ``get``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable

from torch.distributed import Store

from mbr_launch import outside
from mbr_launch.cluster import storevalue
from mbr_launch.cluster.jobstore import LAYOUT_KEY as KEY, JobStore, size_key
from mbr_launch.cluster.storevalue import Sealer


@dataclass(frozen=True)
class Layout:
    token: str
    restarts: int
    master_port: int
    sizes: list[int]  # workers per node, by group rank

    def offset(self, group_rank: int) -> int:
        return sum(self.sizes[:group_rank])


def encode_sizes(sizes: list[int]) -> str:
    runs: list[list[int]] = []
    for size in sizes:
        if runs and runs[-1][0] == size:
            runs[-1][1] += 1
        else:
            runs.append([size, 1])
    return ",".join(f"{size}x{count}" for size, count in runs)


# Bounds of what another node wrote: workers per node, nodes, restarts. A forged "1x99999999999" stops here.
MAX_NPROC, MAX_NODES, MAX_RESTARTS = 1 << 16, 1 << 20, 1 << 30


class LayoutUnreadable(ValueError):
    """The layout (or a node's size) in the store is not one an agent of this job wrote; says why."""


def decode_sizes(text: str, nodes: int) -> list[int]:
    """``8x4096`` -> the sizes; raises LayoutUnreadable unless it is exactly ``nodes`` sizes in bounds."""
    sizes: list[int] = []
    for run in text.split(",")[:nodes + 1]:
        size_text, _, count_text = run.partition("x")
        size = outside.integer(_digits(size_text), 1, MAX_NPROC)
        count = outside.integer(_digits(count_text), 1, nodes - len(sizes))
        if size is None or count is None:
            raise LayoutUnreadable(f"node sizes {outside.text(text, limit=80)!r} do not describe {nodes} nodes")
        sizes.extend([size] * count)
    if len(sizes) != nodes:
        raise LayoutUnreadable(f"node sizes {outside.text(text, limit=80)!r} do not describe {nodes} nodes")
    return sizes


def _digits(text: str) -> int | None:
    return int(text) if text.isdigit() and len(text) <= 10 else None


def agree(store: Store, group_rank: int, group_world_size: int, nproc: int,
          make: Callable[[], tuple[str, int, int]], scope: str = "", sealer: Sealer | None = None) -> Layout:
    """Announce this node's size; group rank 0 also publishes the layout with ``make()`` = (token, restarts,
    master port). ``scope`` (the round) is sealed in, so an earlier round's layout is refused. Raises
    LayoutUnreadable for a value no agent of this job wrote."""
    own = JobStore(store, scope, sealer or Sealer())
    own.put(size_key(group_rank), str(nproc))
    if group_rank == 0:
        keys = [size_key(r) for r in range(group_world_size)]
        sizes = [_size(own, k, raw) for k, raw in zip(keys, own.get_many(keys))]
        token, restarts, port = make()
        own.put(KEY, json.dumps(
            {"token": token, "restarts": restarts, "master_port": port, "sizes": encode_sizes(sizes)}))
    try:
        data = own.decode(KEY, own.get(KEY))
    except storevalue.RefusedValue as err:
        raise LayoutUnreadable(f"the round's rank layout in the store was refused: {err}") from None
    data = data if isinstance(data, dict) else {}
    token = data.get("token")
    restarts = outside.integer(data.get("restarts"), 0, MAX_RESTARTS)
    port = outside.integer(data.get("master_port"), 1, 65535)
    if not (isinstance(token, str) and token.isalnum() and len(token) <= 64) or restarts is None or port is None \
            or not isinstance(data.get("sizes"), str):
        raise LayoutUnreadable("the round's rank layout in the store has fields out of range")
    return Layout(token=token, restarts=restarts, master_port=port,
                  sizes=decode_sizes(data["sizes"], group_world_size))


def _size(own: JobStore, key: str, raw: bytes) -> int:
    try:
        value = outside.integer(_digits(own.open(key, raw).decode("ascii", "replace")), 1, MAX_NPROC)
    except storevalue.RefusedValue as err:
        raise LayoutUnreadable(f"a node's size in the store was refused: {err}") from None
    if value is None:
        raise LayoutUnreadable("a node's size in the store is not a number of workers")
    return value
