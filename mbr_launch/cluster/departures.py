"""Nodes stopped by a signal, and nodes that left a round (``decide.leaving``).

``signalled`` counts the nodes a stop signal reached; the one completing the count leaves ``JOB_STOP_KEY`` for
the spares. ``left`` lists the group ranks that left: the peer watch skips them, and the lowest rank still in
the round takes over the watch when group rank 0 leaves.
"""

from __future__ import annotations

import json

from mbr_launch import outside
from mbr_launch.cluster import storevalue
from mbr_launch.cluster.jobstore import JOB_STOP_KEY, LEFT_KEY, SIGNALLED_KEY, JobStore
from mbr_launch.cluster.round import Round

TRIES = 50  # compare-and-set attempts on the list of departures (one per node that leaves at the same time)


def record_signal(rnd: Round, job: JobStore, signal_name: str) -> int:
    """Count this node as reached by a stop signal (once per round: the caller's duty); returns the count."""
    count = JobStore.of_round(rnd).add(SIGNALLED_KEY, 1)
    if count >= rnd.group_world_size:
        job.claim(JOB_STOP_KEY, signal_name)
    return count


def signalled(rnd: Round) -> int:
    return JobStore.of_round(rnd).add(SIGNALLED_KEY, 0)


def job_stopped(raw: bytes | None) -> str | None:
    """The signal that stopped the whole job, from ``JOB_STOP_KEY`` (opened); None when there is none."""
    name = outside.text(raw.decode("ascii", errors="replace") if raw else None, "", 16)
    return name if name.startswith("SIG") and name[3:].isalnum() else None


def decode_left(raw: bytes | str | None, *, keys: JobStore, nodes: int) -> frozenset[int]:
    """The group ranks in a ``left`` value, each in ``[0, nodes)``; a missing or refused value is none."""
    try:
        value = keys.decode(LEFT_KEY, raw, depth=1) if raw else []
    except storevalue.RefusedValue:
        value = []
    if not isinstance(value, list):
        return frozenset()
    return frozenset(r for r in (outside.integer(v, 0, nodes - 1) for v in value[:nodes]) if r is not None)


def mark_left(rnd: Round, group_rank: int) -> frozenset[int]:
    """Add ``group_rank`` to the round's departures; returns all of them. A forged value is replaced."""
    keys = JobStore.of_round(rnd)
    current = keys.compare_set(LEFT_KEY, "", keys.seal(LEFT_KEY, "[]"))
    for _ in range(TRIES):
        gone = decode_left(current, keys=keys, nodes=rnd.group_world_size) | {group_rank}
        new = keys.seal(LEFT_KEY, json.dumps(sorted(gone)))
        stored = keys.compare_set(LEFT_KEY, current, new)
        if stored == new:
            return gone
        current = stored
    raise storevalue.RefusedValue(f"the round's departures changed under every one of {TRIES} writes")


def read_left(rnd: Round) -> frozenset[int]:
    keys = JobStore.of_round(rnd)
    if not keys.check([LEFT_KEY]):
        return frozenset()
    return decode_left(keys.get(LEFT_KEY), keys=keys, nodes=rnd.group_world_size)
