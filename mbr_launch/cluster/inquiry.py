"""The job-wide hang inquiry, over the round's control keys.

In a synchronous job every rank stalls within the same step, so the rank whose deadline fired first is as
often healthy as not: the first expiry opens an inquiry, every node sends its evidence, the opener's node
decides (keys: ``jobstore.inquiry_key``). Decoding never raises.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Callable

from mbr_launch import outside
from mbr_launch.cluster import storevalue
from mbr_launch.cluster.jobstore import WAIT_SLICE, JobStore, inquiry_key
from mbr_launch.cluster.round import Round


@dataclass(frozen=True)
class Opener:
    number: int
    group_rank: int  # the node that decides
    rank: int | None  # the rank whose deadline passed first
    kind: str  # which deadline

    def encode(self) -> str:
        return json.dumps({"group_rank": self.group_rank, "rank": self.rank, "kind": self.kind})

    @staticmethod
    def decode(number: int, raw: bytes | str) -> "Opener":
        """``raw`` opened already (its seal verified); never raises: what cannot be read decides nothing."""
        try:
            data = storevalue.decode_json(raw)
        except storevalue.RefusedValue:
            data = {}
        data = data if isinstance(data, dict) else {}
        group_rank = outside.integer(data.get("group_rank"), 0, MAX_NODES)
        return Opener(number=number, group_rank=group_rank if group_rank is not None else 0,
                      rank=outside.integer(data.get("rank"), 0, MAX_NODES * 1024),
                      kind=outside.text(data.get("kind"), "", 64))


MAX_NODES = 1 << 20


def _open(keys: JobStore, key: str, raw: bytes) -> Any:
    try:
        return keys.decode(key, raw)
    except storevalue.RefusedValue:
        return None


def open_inquiry(rnd: Round, opener: Opener) -> Opener:
    """Open inquiry ``opener.number``, or join it when another node opened it first; the winning opener."""
    _, stands = JobStore.of_round(rnd).claim(inquiry_key(opener.number, "open"), opener.encode())
    # None: a neighbour's value stood through every claim, and this node decides for itself
    return Opener.decode(opener.number, stands) if stands is not None else opener


def publish_evidence(rnd: Round, number: int, group_rank: int, evidence: list[dict[str, Any]]) -> None:
    key = inquiry_key(number, "evidence", str(group_rank))
    JobStore.of_round(rnd).put(key, json.dumps(evidence))


def collect_evidence(rnd: Round, number: int, *, nodes: int, deadline: float, gone: frozenset[int] = frozenset(),
                     clock: Callable[[], float] = time.monotonic) -> dict[int, list[dict[str, Any]]]:
    """Every node's evidence that arrived before ``deadline`` (a silent node is missing; ``gone`` is not
    waited for). One wait and one multi-get, not a poll per key: two store operations whatever the size."""
    store = JobStore.of_round(rnd)
    keys = {g: inquiry_key(number, "evidence", str(g)) for g in range(nodes) if g not in gone}
    if store.wait_until(list(keys.values()), deadline, clock):
        present = list(keys)
    else:
        present = [g for g, key in keys.items() if store.check([key])]
    found: dict[int, list[dict[str, Any]]] = {}
    for g, raw in zip(present, store.get_many([keys[g] for g in present])):
        value = _open(store, keys[g], raw)
        if isinstance(value, list):
            found[g] = [v for v in value if isinstance(v, dict)]
    return found


def publish_verdict(rnd: Round, number: int, verdict: dict[str, Any]) -> dict[str, Any]:
    """The first verdict of the inquiry wins; returns it."""
    key = inquiry_key(number, "verdict")
    _, stands = JobStore.of_round(rnd).claim(key, json.dumps(verdict))
    try:
        value = storevalue.decode_json(stands)
    except storevalue.RefusedValue:
        return verdict
    return value if isinstance(value, dict) else verdict


def wait_verdict(rnd: Round, number: int, *, deadline: float,
                 clock: Callable[[], float] = time.monotonic) -> dict[str, Any] | None:
    key, store = inquiry_key(number, "verdict"), JobStore.of_round(rnd)
    while store.wait_until([key], deadline, clock):
        value = _open(store, key, store.get(key))
        if isinstance(value, dict):
            return value
        if store.sealer.enabled and clock() < deadline:
            time.sleep(min(WAIT_SLICE, max(0.0, deadline - clock())))  # a forgery: the decider's replaces it
            continue
        return None
    return None
