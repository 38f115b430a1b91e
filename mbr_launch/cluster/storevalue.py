"""Every value an agent reads from the rendezvous store, verified and decoded in one place.

Anyone who reaches the store's port can write it, so a value read back is untrusted: with a job secret every
value we write carries an HMAC-SHA256 of key and value, verified before parsing (or unpickling); every JSON
value is bounded in size and depth. A refused value is treated as absent, never as the agent's error.
"""

from __future__ import annotations

import hashlib
import hmac
import sys
from typing import Any

from mbr_launch.outside import RefusedValue, json_value
from mbr_launch.visible import one_line

MAX_BYTES = 4 << 20  # the largest value we write is a node's evidence: hundreds of ranks of a few kB
# The deepest value we write is a node's evidence: list > rank > progress list > group > ranks list.
MAX_DEPTH = 8
_TAG = b"mbr1."  # a sealed value: _TAG + 64 hex digits of HMAC-SHA256 + "." + the value
_MAC_LEN = 64
_RAW_BOUND = MAX_BYTES + len(_TAG) + _MAC_LEN + 1  # a value of MAX_BYTES, sealed


class Sealer:
    """The job's secret, or none: seals what we write, opens what we read. One per job, shared by all threads."""

    def __init__(self, secret: bytes | None = None) -> None:
        self._secret = secret or None
        self._warned: set[str] = set()  # keys whose forged value was said already
        self.seen: dict[str, int] = {}  # full key of a sealed counter -> the highest value this agent saw (add)

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
        data = raw.encode() if isinstance(raw, str) else bytes(raw)
        if self._secret is None:
            return data
        if not data.startswith(_TAG) or data[len(_TAG) + _MAC_LEN:len(_TAG) + _MAC_LEN + 1] != b".":
            raise self._forged(key, "not sealed with the job's secret")
        mac, value = data[len(_TAG):len(_TAG) + _MAC_LEN], data[len(_TAG) + _MAC_LEN + 1:]
        if not hmac.compare_digest(mac, self._mac(key, value)):
            raise self._forged(key, "its seal does not verify with the job's secret")
        return value

    def _forged(self, key: str, why: str) -> RefusedValue:
        if key not in self._warned and len(self._warned) < 100:
            self._warned.add(key)
            sys.stderr.write(f"mbr-launch: warning: refused the rendezvous store's value of {one_line(key, 200)}: "
                             f"{why}; a process without the job's secret wrote it\n")
            sys.stderr.flush()
        return RefusedValue(why)


def bounded(raw: bytes | str) -> bytes | str:
    if len(raw) > _RAW_BOUND:
        raise RefusedValue(f"{len(raw)} bytes, over the bound of {MAX_BYTES}")
    return raw


def decode_json(raw: bytes | str | None, *, depth: int = MAX_DEPTH) -> Any:
    if raw is None:
        raise RefusedValue("missing")
    return json_value(bounded(raw), max_bytes=_RAW_BOUND, depth=depth)

