"""The fast path between rounds: the same agents agree on the next round in one store round trip.

A job-wide restart keeps every node, so the next round needs only a token, a MASTER_PORT and the restart
count. Every agent adds 1 to a counter under the failed round's keys; group rank 0 packs its port and the
restart count into its addition (``pack``). The agent completing the count claims the decision
"go:<sum>:<nonce>"; the next token derives from the nonce, so no one can plant values under it beforehand.
Any agent may claim "abort:<why>" instead; exactly one decision stands, so all take the same path: the fast
round, or the full c10d join. Pure logic over an injected store and clock.
"""

from __future__ import annotations

import hashlib
import secrets
import string
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable, Protocol, Union

from mbr_launch.cluster import storevalue
from mbr_launch.cluster.jobstore import ARRIVED_KEY, DECIDED_KEY, WAIT_SLICE, JobStore
from mbr_launch.cluster.storevalue import Sealer

GO, ABORT = "go:", "abort:"
COUNT_BITS = 20  # up to a million agents
PORT_BITS = 16
RESTART_LIMIT = 1 << (63 - COUNT_BITS - PORT_BITS)  # the sum must fit torch's signed 64-bit counter
NONCE_BYTES = 16  # of the decision's nonce (hex on the wire): the next token cannot be guessed either


class FastStore(Protocol):
    def add(self, key: str, value: int) -> int: ...
    def compare_set(self, key: str, expected: str, desired: str) -> bytes: ...
    def check(self, keys: list[str]) -> bool: ...
    def wait(self, keys: list[str], timeout: timedelta) -> None: ...
    def get(self, key: str) -> bytes: ...


@dataclass(frozen=True)
class Agreement:
    token: str
    master_port: int
    restart_count: int


@dataclass(frozen=True)
class Fallback:
    """The agents go to the full c10d join; ``reason`` says why (recorded in the rendezvous event)."""

    reason: str


Outcome = Union[Agreement, Fallback]


def pack(count: int, master_port: int = 0, restarts: int = 0) -> int:
    if not 0 <= master_port < (1 << PORT_BITS) or not 0 <= restarts < RESTART_LIMIT or not 0 <= count < (1 << COUNT_BITS):
        raise ValueError(f"cannot pack count {count}, port {master_port}, restarts {restarts}")
    return count | (master_port << COUNT_BITS) | (restarts << (COUNT_BITS + PORT_BITS))


def unpack(value: int) -> tuple[int, int, int]:
    return (value & ((1 << COUNT_BITS) - 1), (value >> COUNT_BITS) & ((1 << PORT_BITS) - 1),
            value >> (COUNT_BITS + PORT_BITS))


def next_token(token: str, nonce: str) -> str:
    """The fast round's token: the same for every agent, new, and unknown before the decision."""
    return hashlib.sha1(f"{token}/fast/{nonce}".encode()).hexdigest()[:12]


def go(arrived: int) -> str:
    return f"{GO}{arrived}:{secrets.token_hex(NONCE_BYTES)}"


def read_decision(raw: bytes | str, *, token: str, nodes: int) -> Outcome:
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
    if text.startswith(GO):
        total, _, nonce = text[len(GO):].partition(":")
        if len(nonce) != 2 * NONCE_BYTES or not set(nonce) <= set(string.hexdigits):
            # no agent decides without one: a token known beforehand is what the nonce is there to prevent
            return Fallback(f"fast-path decision without a nonce {text[:60]!r}")
        try:
            count, port, restarts = unpack(int(total))
        except ValueError:
            return Fallback(f"unreadable fast-path decision {text[:60]!r}")
        if count != nodes or port == 0:
            return Fallback(f"fast-path decision for {count} nodes (port {port}); this round had {nodes}")
        return Agreement(token=next_token(token, nonce), master_port=port, restart_count=restarts)
    if text.startswith(ABORT):
        return Fallback(text[len(ABORT):] or "aborted")
    return Fallback(f"unreadable fast-path decision {text[:40]!r}")


def abort(control: FastStore, reason: str, *, token: str, nodes: int, scope: str = "",
          sealer: Sealer | None = None) -> Outcome:
    """Send every agent of the round to the full join; returns what stands (an earlier decision wins)."""
    return _decide(_keys(control, scope, sealer), ABORT + reason, token=token, nodes=nodes)


def _keys(control: FastStore, scope: str, sealer: Sealer | None) -> JobStore:
    return JobStore(control, scope or None, sealer or Sealer())


def _decide(keys: JobStore, decision: str, *, token: str, nodes: int) -> Outcome:
    _, stands = keys.claim(DECIDED_KEY, decision)
    if stands is None:
        return Fallback("fast-path decision refused: a value without the job's seal stood through every claim")
    return read_decision(stands, token=token, nodes=nodes)


def agree(control: FastStore, *, group_rank: int, nodes: int, token: str, timeout: float,
          master_port: int = 0, restarts: int = 0, clock: Callable[[], float] = time.monotonic,
          scope: str = "", sealer: Sealer | None = None) -> Outcome:
    """Arrive at the fast round of the failed round whose control keys are ``control``; group rank 0 passes the
    master port and restart count. Waits in slices on the shared connection, so the keep-alive gets its turn
    (a connection per agent met torch's connect back-off)."""
    keys = _keys(control, scope, sealer)
    contribution = pack(1, master_port, restarts) if group_rank == 0 else 1
    arrived = keys.count(ARRIVED_KEY, contribution)
    count = unpack(arrived)[0]
    if count == nodes:  # the last to arrive: the sum now holds group rank 0's values
        return _decide(keys, go(arrived), token=token, nodes=nodes)
    if count > nodes:
        return _decide(keys, ABORT + f"{count} agents arrived for a round of {nodes}", token=token, nodes=nodes)
    if not keys.wait_until([DECIDED_KEY], clock() + timeout, clock):
        # the decision may still be taken meanwhile: the claim returns whichever stands
        return _decide(keys, ABORT + f"not all {nodes} agents arrived within {timeout:g} s", token=token,
                       nodes=nodes)
    try:
        return read_decision(keys.read(DECIDED_KEY), token=token, nodes=nodes)
    except storevalue.RefusedValue as err:
        return Fallback(f"fast-path decision refused: {err}")

