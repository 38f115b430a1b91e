"""Stop messages between the agents of one round, and the "every node is done" mark.

A stop message lives under the round's control keys (``Round.control``), so a late message from an old round
is never read by a new one. The first message published in a round wins (``compare_set``): when two nodes
fail at once, both act on the same decision. Messages are decoded once, here, into ``StopMessage``.
"""

from __future__ import annotations

import datetime
import json
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

from mbr_launch import outside
from mbr_launch.cluster import storevalue
from mbr_launch.cluster.jobstore import (ALL_DONE_KEY, ALL_GONE_KEY, DONE_COUNT_KEY, FAREWELLS_KEY, STOP_KEY,
                                         UNHEALTHY_KEY, JobStore)
from mbr_launch.cluster.rendezvous import release_control
from mbr_launch.cluster.round import Round
from mbr_launch.report import exitcodes

FAREWELL_SLICE = 0.25  # seconds of one wait for the last farewell, between reads of the count
# Bounds of a stop message's numbers: a job's nodes and restarts with room; a backoff of a day at most.
MAX_NODES, MAX_COUNT, MAX_BACKOFF = 1 << 20, 1 << 30, 86400.0


@dataclass(frozen=True)
class StopMessage:
    """What one node tells every node of the round: stop the workers, then restart (or end the job)."""

    reason: str
    origin: str = ""  # the node that published it
    group_rank: int | None = None  # its group rank (None: not from a node's own failure)
    final: bool = False  # the job ends: no new round
    exit_code: int = exitcodes.FAILED  # with ``final``: the code every node exits with
    restart_count: int | None = None  # job-wide restarts counted, this one included
    backoff: float = 0.0  # seconds to wait before the next round (a crash loop)
    membership: bool = False  # not a failure: nodes wait to join, so the round re-forms
    exclude: str | None = None  # the node that leaves the job

    def encode(self) -> str:
        return json.dumps({k: v for k, v in asdict(self).items() if v is not None})

    @staticmethod
    def decode(raw: bytes | str) -> "StopMessage":
        """Never raises: a message we cannot read still stops the round (as a failure, never as the job's end).
        ``raw`` is opened already; every field is bounded and checked."""
        try:
            data = storevalue.decode_json(raw)
        except storevalue.RefusedValue:
            data = None
        if not isinstance(data, dict):
            return StopMessage(reason="peer requested stop (its message was unreadable)")
        values: dict[str, Any] = {
            "reason": outside.text(data.get("reason"), "peer requested stop"),
            "origin": outside.text(data.get("origin"), "", 255),
            "group_rank": outside.integer(data.get("group_rank"), 0, MAX_NODES),
            "final": data.get("final") is True,
            "exit_code": outside.integer(data.get("exit_code"), 0, 255),
            "restart_count": outside.integer(data.get("restart_count"), 0, MAX_COUNT),
            "backoff": outside.finite(data.get("backoff"), 0.0, MAX_BACKOFF),
            "membership": data.get("membership") is True,
            "exclude": outside.text(data.get("exclude"), "", 255) or None,
        }
        return StopMessage(**{k: v for k, v in values.items() if v is not None})


def publish_stop(rnd: Round, message: StopMessage) -> bool:
    """Tell every node of the round to stop its workers; True when this call was the first (authentic) one."""
    first, _ = JobStore.of_round(rnd).claim(STOP_KEY, message.encode())
    return first


def read_stop(rnd: Round) -> StopMessage | None:
    """The round's stop message; None when there is none, or only one without the job's seal."""
    raw = JobStore.of_round(rnd).read_if_set(STOP_KEY)
    return None if raw is None else StopMessage.decode(raw)


def mark_done(rnd: Round) -> bool:
    keys = JobStore.of_round(rnd)
    if keys.count(DONE_COUNT_KEY, 1) >= rnd.group_world_size:
        keys.put(ALL_DONE_KEY, "1")
        return True
    return False


def farewell(rnd: Round) -> None:
    """This node is done with a successful job and leaves; the last one to say so tells the store's host."""
    keys = JobStore.of_round(rnd)
    if keys.count(FAREWELLS_KEY, 1) >= rnd.group_world_size:
        keys.put(ALL_GONE_KEY, "1")


def await_farewells(rnd: Round, quiet: float, cap: float, clock: Callable[[], float] = time.monotonic) -> bool:
    """The store's host, after a successful job: wait for every node's farewell (else a slower node finds the
    store gone and exits 3). Gives up (False) after ``quiet`` seconds without a new one or ``cap`` in all;
    raises when the store itself fails."""
    start, keys = clock(), JobStore.of_round(rnd)
    seen, last_new = -1, start
    while True:
        try:
            keys.wait([ALL_GONE_KEY], datetime.timedelta(seconds=FAREWELL_SLICE))
            keys.read(ALL_GONE_KEY)
            return True
        except storevalue.RefusedValue:  # not an agent's mark: count the farewells instead
            time.sleep(FAREWELL_SLICE)
        except Exception:  # noqa: BLE001 - torch raises one type for a timeout and a failure: the add tells
            pass
        count, now = keys.count(FAREWELLS_KEY, 0), clock()
        if count >= rnd.group_world_size:
            return True
        if count != seen:
            seen, last_new = count, now
        if now - last_new >= quiet or now - start >= cap:
            return False


def count_unhealthy(rnd: Round, *, add: bool) -> int:
    """Nodes of the round that lost a rank (``--restart-policy min-healthy``); ``add``: this node just did.
    One atomic counter: when two nodes lose ranks at once, exactly one of them sees the count cross MIN."""
    return JobStore.of_round(rnd).add(UNHEALTHY_KEY, 1 if add else 0)


class StopListener:
    """Waits in a thread, on a connection of its own, for a key of one round (a peer's stop message, or "all
    done"); hands its value to ``on_value``."""

    # How long one blocking wait lasts: bounds how long a cancelled watcher lingers (joined at exit).
    POLL = 1.0

    def __init__(self, rnd: Round, on_value: Callable[[bytes], None], *, key: str = STOP_KEY) -> None:
        self._key = key
        self._sealer = rnd.sealer
        self._connect = rnd.connect_control
        self._scope = rnd.control_prefix
        self._on_value = on_value
        self._cancelled = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"{key}-watch-{rnd.index}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def cancel(self) -> None:
        self._cancelled.set()

    def join(self, timeout: float) -> None:
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        try:
            store = self._connect()
        except Exception:
            return
        if self._watch(store):
            release_control(store)  # its last operation answered: the next round's watcher takes it

    def _watch(self, store: Any) -> bool:
        answered = True
        while not self._cancelled.is_set():
            try:
                store.wait([self._key], datetime.timedelta(seconds=self.POLL))
                answered = True
            except Exception as err:
                answered = "timeout" in str(err).lower()
                continue
            if self._cancelled.is_set():
                return answered
            try:
                value = JobStore(store, self._scope, self._sealer).read(self._key)
            except storevalue.RefusedValue:
                # A forgery: the real value replaces it; the key exists, so pause instead of waiting.
                self._cancelled.wait(self.POLL)
                continue
            except Exception:
                value, answered = b"", False
            self._on_value(value)
            return answered
        return answered
