"""The job's own keys on the rendezvous store, behind one facade.

Every read and write goes through a ``JobStore`` (one key space, sealed under its scope, so a value copied from
another round is refused), which bounds and verifies values.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any, Callable

from mbr_launch.cluster.storeguard import wait_timed_out
from mbr_launch.cluster.storevalue import MAX_DEPTH, RefusedValue, Sealer, bounded, decode_json

# The longest single blocking wait: torch's keep-alive may share the connection and gets its turn between
# slices, and the main thread answers a signal within one.
WAIT_SLICE = 0.5

# ---- every key of ours: its name, how it is written, who decodes it ----------------------------------------
# Names and bytes are a protocol between agents (mixed versions read them): never rename one. "sealed" values
# carry the job's MAC when it has a secret; "counted" ones are torch's plain add; a "claim" is won by the first
# authentic writer (``JobStore.claim``).

# A round's control keys (``Round.control``: ``mbr/job/<run id>/round/<token>/``; sealed under that prefix).
STOP_KEY = "stop"  # claim: the round's stop message (stops.StopMessage)
ALL_DONE_KEY = "all_done"  # sealed "1": every node's workers are done (stops.mark_done)
DONE_COUNT_KEY = "done_count"  # counted: nodes whose workers are done
UNHEALTHY_KEY = "unhealthy_nodes"  # sealed counter: nodes that lost a rank (--restart-policy min-healthy)
FAREWELLS_KEY, ALL_GONE_KEY = "farewells", "all_farewells"  # counted; sealed "1" by the last (stops.farewell)
SIGNALLED_KEY = "signalled"  # sealed counter: nodes reached by a stop signal (departures)
LEFT_KEY = "left"  # sealed JSON list of group ranks, by compare-and-set (departures.decode_left)
FAILED_KEY = "failed"  # claim: the first reporter of a failure spends the restart (Rendezvous.count_restart)
ARRIVED_KEY = "next/arrived"  # counted: the fast round's arrivals, packed with rank 0's values (fastround)
DECIDED_KEY = "next/decided"  # claim: the fast round's decision (fastround.read_decision)
# Membership: on the peer watch's own connection (``peers``), plain (not sealed).
STORE_HOST_KEY = "storehost"  # the store host's identity (decide.liveness.Identity)


def beat_key(group_rank: int) -> str:  # one node's heartbeat (decide.liveness.Beat)
    return f"hb/{group_rank}"


def inquiry_key(number: int, *parts: str) -> str:
    """A hang inquiry's keys: ``open`` (claim, inquiry.Opener), ``evidence/<group rank>`` (sealed JSON list),
    ``verdict`` (claim, JSON object)."""
    return "/".join(("inquiry", str(number), *parts))


# The job's keys that outlive rounds (``Rendezvous.job_store``: ``mbr/job/<run id>/``; sealed under the bare
# name, the counters under the job's prefix). The progress record (decide.noprogress): each round's verdict is
# claimed by its first scorer, whose record every node adopts; a verdict to stop is left for the spares.
JOB_STOP_KEY = "signal_stop"  # claim: the signal that stopped the whole job (departures.job_stopped)
TRACKING_KEY = "nvrx/progress"  # sealed: the job-wide progress record
NO_RESTART_KEY = "nvrx/no_restart"  # sealed: why the job ended for lack of progress (agent.cycles)
RESTARTS_KEY, STARTUP_RESTARTS_KEY = "restarts", "startup_restarts"  # sealed counters


def progress_claim_key(token: str) -> str:  # claim: round ``token``'s progress verdict
    return f"nvrx/progress/round/{token}"


def node_failures_key(node: str) -> str:  # sealed counter: one node's failures
    return f"node_failures/{node}"


# A round's coordination store (torch's round prefix; sealed under ``round<torch's round number>/``).
LAYOUT_KEY = "mbr/layout"  # sealed JSON: token, restarts, master port, node sizes (layout.agree)


def size_key(group_rank: int) -> str:  # sealed digits: one node's number of workers (layout.agree)
    return f"mbr/lws/{group_rank}"


class JobStore:
    """One key space of the job on ``store`` (its raw store), sealed with the job's ``sealer``: a value's seal
    names ``f"{scope}/{key}"``, or the bare key for a ``scope`` of None."""

    def __init__(self, store: Any, scope: str | None, sealer: Sealer) -> None:
        self.store, self.scope, self.sealer = store, scope, sealer

    @classmethod
    def of_round(cls, rnd: Any) -> JobStore:
        return cls(rnd.control, rnd.control_prefix or None, rnd.sealer)

    def full(self, key: str) -> str:
        return key if self.scope is None else f"{self.scope}/{key}"

    def seal(self, key: str, value: str | bytes) -> bytes:
        return self.sealer.seal(self.full(key), value)

    def open(self, key: str, raw: bytes | str) -> bytes:
        return self.sealer.open(self.full(key), bounded(raw))

    def decode(self, key: str, raw: bytes | str | None, depth: int = MAX_DEPTH) -> Any:
        return decode_json(None if raw is None else self.open(key, raw), depth=depth)

    def put(self, key: str, value: str | bytes) -> None:
        self.store.set(key, self.seal(key, value))

    def read(self, key: str) -> bytes:
        return self.open(key, self.store.get(key))

    def read_if_set(self, key: str) -> bytes | None:
        if not self.store.check([key]):
            return None
        try:
            return self.read(key)
        except RefusedValue:
            return None

    def claim(self, key: str, value: str | bytes, tries: int = 4) -> tuple[bool, bytes | None]:
        """``compare_set(key, "", value)`` (sealed) where the first *authentic* writer wins (a forgery is
        replaced). Returns whether ``value`` stands, and what stands, opened (None: a forgery outlasted us)."""
        mine = self.seal(key, value)
        stored = self.store.compare_set(key, "", mine)
        for attempt in range(tries + 1):
            try:
                return stored == mine, self.open(key, stored)
            except RefusedValue:
                if attempt < tries:
                    stored = self.store.compare_set(key, stored, mine)
        return False, None

    def add(self, key: str, amount: int, tries: int = 200) -> int:
        """``store.add`` for a counter that steers the job; with a secret, a sealed value changed by
        compare-and-set, so a neighbour cannot spend the budget. A forgery is replaced, counted from the highest
        value seen here."""
        if not self.sealer.enabled:
            return int(self.store.add(key, amount))
        full, seen = self.full(key), self.sealer.seen
        for _ in range(tries):
            raw = self.store.compare_set(key, "", self.seal(key, "0"))  # creates it at 0, or hands back what is there
            try:
                digits = self.open(key, raw)
                current = int(digits) if digits.isdigit() and len(digits) <= 12 else None
            except RefusedValue:
                current = None
            if current is None:
                current = seen.get(full, 0)
            elif amount == 0:
                seen[full] = max(current, seen.get(full, 0))
                return current
            new = self.seal(key, str(current + amount))
            if self.store.compare_set(key, raw, new) == new:
                seen[full] = current + amount
                return current + amount
        raise RefusedValue(f"the counter {key} changed under every one of {tries} writes")

    # -- the raw store's own operations: unsealed counters (a forged one only costs time), waits ------------

    def count(self, key: str, amount: int) -> int:
        return int(self.store.add(key, amount))

    def check(self, keys: list[str]) -> bool:
        return bool(self.store.check(keys))

    def wait(self, keys: list[str], timeout: timedelta) -> None:
        self.store.wait(keys, timeout)

    def wait_until(self, keys: list[str], deadline: float, clock: Callable[[], float] = time.monotonic) -> bool:
        """Whether every key was set before ``deadline``: the store's wait in slices of ``WAIT_SLICE``; errors
        other than a slice's timeout are raised."""
        timed_out = wait_timed_out()
        while True:
            left = deadline - clock()
            if left <= 0:
                return self.check(keys)
            try:
                self.wait(keys, timedelta(seconds=min(WAIT_SLICE, left)))
                return True
            except timed_out:
                continue

    def get(self, key: str) -> bytes:
        return self.store.get(key)

    def get_many(self, keys: list[str]) -> list[bytes]:
        if not keys:
            return []
        multi_get = getattr(self.store, "multi_get", None)
        if multi_get is not None:
            return list(multi_get(keys))
        return [self.store.get(k) for k in keys]

    def compare_set(self, key: str, expected: str | bytes, desired: str | bytes) -> bytes:
        return self.store.compare_set(key, expected, desired)

