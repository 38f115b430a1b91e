"""A round's rank layout in O(1) store operations per agent (issue #18).

Every node announces its number of workers under its group rank; group rank 0 reads them all in one
``multi_get`` (it waits for the late ones) and publishes one key with what every node needs: the round's token,
the job-wide restart count, the workers' master port and the node sizes, run-length encoded (``8x4096``: the
usual case of equal nodes costs a few bytes, not one number per node). Every other node then makes one blocking
``get``: 2 operations per agent and O(1) bytes for equal nodes, where reading every node's size took N+4
operations per agent and O(N^2) on the store's host per round.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable

from torch.distributed import Store

KEY = "mbr/layout"


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


def decode_sizes(text: str) -> list[int]:
    return [int(size) for run in text.split(",") if run for size, count in [run.split("x")]
            for _ in range(int(count))]


def agree(store: Store, group_rank: int, group_world_size: int, nproc: int,
          make: Callable[[], tuple[str, int, int]]) -> Layout:
    """Announce this node's size; group rank 0 also gathers every size and publishes the layout with
    ``make()`` = (token, restarts, master port). Blocking gets wait up to the store's timeout."""
    store.set(f"mbr/lws/{group_rank}", str(nproc))
    if group_rank == 0:
        raw = store.multi_get([f"mbr/lws/{r}" for r in range(group_world_size)])
        sizes = [int(v) for v in raw]
        token, restarts, port = make()
        store.set(KEY, json.dumps({"token": token, "restarts": restarts, "master_port": port,
                                   "sizes": encode_sizes(sizes)}))
    data = json.loads(store.get(KEY))
    return Layout(token=str(data["token"]), restarts=int(data["restarts"]), master_port=int(data["master_port"]),
                  sizes=decode_sizes(data["sizes"]))
