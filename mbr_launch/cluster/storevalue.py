"""Every value an agent reads from the rendezvous store, decoded in one place.

The store is a TCP port: anyone who can reach it can write any key (PyTorch's SECURITY.md: the store must be
reachable by the job only). So a value read back is untrusted input, whoever we expect wrote it:

- with a job secret (``--rdzv-secret-file``), every value we write carries an HMAC-SHA256 of the key and the
  value, and a value whose MAC does not verify is refused before it is parsed (or, for torch's state, before
  it is unpickled: ``cluster.sealedstate``);
- every JSON value is decoded here: bounded in size and depth, NaN and infinities refused, any exception of
  the parser a refusal with a reason (``outside.json_value``); the typed decoders above this (stops, inquiry,
  layout, ...) take numbers in range and strings through ``outside``'s readers.

A refused value is never an error of the agent: the caller treats it as absent, says so, and goes on.
"""

from __future__ import annotations

import hashlib
import hmac
import sys
from typing import Any

from mbr_launch.outside import RefusedValue, json_value
from mbr_launch.visible import one_line

# A stop message, an opener or a verdict is under 2 kB; a node's evidence is about 0.5 kB per rank (with Flight
# Recorder groups a few kB): 4 MiB is a node of hundreds of ranks, and a bound on what one read can cost.
MAX_BYTES = 4 << 20
# The deepest value we write is a node's evidence: list > rank > progress list > group > ranks list.
MAX_DEPTH = 8
_TAG = b"mbr1."  # a sealed value: _TAG + 64 hex digits of HMAC-SHA256 + "." + the value
_MAC_LEN = 64
_RAW_BOUND = MAX_BYTES + len(_TAG) + _MAC_LEN + 1  # a value of MAX_BYTES, sealed


class Sealer:
    """The job's secret, or none: seals what we write, opens what we read."""

    def __init__(self, secret: bytes | None = None) -> None:
        self._secret = secret or None

    @property
    def enabled(self) -> bool:
        return self._secret is not None

    def _mac(self, key: str, value: bytes) -> bytes:
        assert self._secret is not None
        # The key is part of the MAC: a sealed value copied to another key (another round's stop) is refused.
        return hmac.new(self._secret, key.encode() + b"\0" + value, hashlib.sha256).hexdigest().encode()

    def seal(self, key: str, value: str | bytes) -> bytes:
        data = value.encode() if isinstance(value, str) else value
        if self._secret is None:
            return data
        return _TAG + self._mac(key, data) + b"." + data

    def open(self, key: str, raw: bytes | str) -> bytes:
        """The value written under ``key``, verified; raises RefusedValue for a value without a valid seal."""
        data = raw.encode() if isinstance(raw, str) else bytes(raw)
        if self._secret is None:
            return data
        if not data.startswith(_TAG) or data[len(_TAG) + _MAC_LEN:len(_TAG) + _MAC_LEN + 1] != b".":
            raise _forged(key, "not sealed with the job's secret")
        mac, value = data[len(_TAG):len(_TAG) + _MAC_LEN], data[len(_TAG) + _MAC_LEN + 1:]
        if not hmac.compare_digest(mac, self._mac(key, value)):
            raise _forged(key, "its seal does not verify with the job's secret")
        return value


_warned: set[str] = set()
_seen: dict[str, int] = {}  # full key of a sealed counter -> the highest value this agent saw (``add``)


def _forged(key: str, why: str) -> RefusedValue:
    """The refusal of a value without a valid seal, said once per key on the agent's stderr: something that
    can reach the store's port but lacks the secret (or another job sharing it by mistake) is writing."""
    if key not in _warned and len(_warned) < 100:
        _warned.add(key)
        sys.stderr.write(f"mbr-launch: warning: refused the rendezvous store's value of {one_line(key, 200)}: "
                         f"{why}; a process without the job's secret wrote it\n")
        sys.stderr.flush()
    return RefusedValue(why)


# One job per process: every reader on every thread uses the same secret, set once at start-up (api.launch).
SEALER = Sealer()


def configure(secret: bytes | None) -> Sealer:
    global SEALER
    SEALER = Sealer(secret)
    return SEALER


def seal(key: str, value: str | bytes) -> bytes:
    return SEALER.seal(key, value)


def scoped(prefix: str, key: str) -> str:
    """The full store key a value is sealed under: a round's control prefix and the key within it."""
    return f"{prefix}/{key}" if prefix else key


def open_value(full_key: str, raw: bytes | str) -> bytes:
    """``raw`` read from ``full_key``, bounded and verified when the job has a secret; raises RefusedValue."""
    _bounded(raw)
    return SEALER.open(full_key, raw)


def _bounded(raw: bytes | str) -> bytes | str:
    if len(raw) > _RAW_BOUND:
        raise RefusedValue(f"{len(raw)} bytes, over the bound of {MAX_BYTES}")
    return raw


def claim(store: Any, key: str, full_key: str, value: str | bytes, tries: int = 4) -> tuple[bool, bytes | None]:
    """``compare_set(key, "", value)`` (sealed) where the first *authentic* writer wins: a value that fails its
    seal (a neighbour's, written first to block ours) is replaced by ours. Returns whether ``value`` is what
    stands, and what stands, opened (None when a forgery stood through every try). Without a secret every
    value is authentic: the first writer wins, as with a plain ``compare_set``."""
    mine = seal(full_key, value)
    stored = store.compare_set(key, "", mine)
    for attempt in range(tries + 1):
        try:
            return stored == mine, open_value(full_key, stored)
        except RefusedValue:
            if attempt < tries:
                stored = store.compare_set(key, stored, mine)
    return False, None


def add(store: Any, key: str, full_key: str, amount: int, tries: int = 200) -> int:
    """``store.add(key, amount)`` for a counter that steers the job (the restart budget, a node's failures, the
    unhealthy nodes): with a secret, a sealed value changed by compare-and-set, so a neighbour's ``add`` of a
    thousand cannot spend the budget or exclude a node. A forged value is replaced, counted from the highest
    value this agent saw (it can neither raise the count nor lower it below that). Without a secret, torch's
    atomic add. Returns the new value, as ``add`` does."""
    if not SEALER.enabled:
        return int(store.add(key, amount))
    for _ in range(tries):
        raw = store.compare_set(key, "", seal(full_key, "0"))  # creates it at 0, or hands back what is there
        try:
            digits = open_value(full_key, raw)
            current = int(digits) if digits.isdigit() and len(digits) <= 12 else None
        except RefusedValue:
            current = None
        if current is None:
            current = _seen.get(full_key, 0)
        elif amount == 0:
            _seen[full_key] = max(current, _seen.get(full_key, 0))
            return current
        new = seal(full_key, str(current + amount))
        if store.compare_set(key, raw, new) == new:
            _seen[full_key] = current + amount
            return current + amount
    raise RefusedValue(f"the counter {key} changed under every one of {tries} writes")


def decode_json(raw: bytes | str | None, *, key: str | None, depth: int = MAX_DEPTH) -> Any:
    """The JSON value stored under ``key``: verified (``key`` None: the caller opened it already), bounded,
    parsed (``outside.json_value``); raises RefusedValue with the reason."""
    if raw is None:
        raise RefusedValue("missing")
    data = open_value(key, raw) if key is not None else _bounded(raw)
    return json_value(data, max_bytes=_RAW_BOUND, depth=depth)


__all__ = ["MAX_BYTES", "MAX_DEPTH", "RefusedValue", "SEALER", "Sealer", "add", "claim", "configure", "decode_json",
           "open_value", "scoped", "seal"]
