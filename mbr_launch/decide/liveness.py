"""When silence means dead or cut off, and when it means only starved of CPU (issue #38).

A peer agent proves it is alive by a beat through the rendezvous store; the store by answering. Only death or
a cut may end a job, never starvation: silence is counted on this process's own time (``OwnTime``), a process
seen alive on this machine is not silent (``Seen.ALIVE``), and the grace grows with the store's slowest recent
answer (``SlowestAnswer``). Pure: clocks and observations in, a number or a verdict out.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

SLOW_FACTOR = 3.0  # a slow store's grace: this many of its slowest recent answers on top of the timeout
CREDIT_TICKS = 2.0  # one tick of OwnTime credits at most this many periods


class Seen(enum.Enum):
    """What this machine can tell of another process."""

    ALIVE = "alive"  # here, running or sleeping: starved at worst, and loopback cannot be cut
    SILENT = "silent"  # here but stopped (state T) or gone, or not here at all: its beats alone tell


class OwnTime:
    """Seconds this process was itself served: ``tick`` every ``period``; a late tick (it waited for a CPU or
    the GIL) credits at most ``CREDIT_TICKS * period``."""

    def __init__(self, now: float, period: float) -> None:
        self.period = period
        self._last = now
        self.credited = 0.0

    def tick(self, now: float) -> float:
        step = max(0.0, now - self._last)
        self._last = now
        self.credited += min(step, CREDIT_TICKS * self.period)
        return self.credited


class SlowestAnswer:
    """The store's slowest recent answer, halving every ``half_life`` seconds (one slow start is forgotten)."""

    def __init__(self, half_life: float) -> None:
        self._half_life = max(half_life, 1e-3)
        self._value = 0.0
        self._at = 0.0

    def seen(self, seconds: float, now: float) -> None:
        if math.isfinite(seconds):
            self._value = max(self.at(now), max(0.0, seconds))
            self._at = now

    def at(self, now: float) -> float:
        return self._value * 0.5 ** (max(0.0, now - self._at) / self._half_life)


def grace(timeout: float, slowest: float) -> float:
    return timeout + SLOW_FACTOR * slowest


class Silence:
    """One subject's silence on ``OwnTime``, reset by a sign of life or by being seen alive here."""

    def __init__(self, own_now: float) -> None:
        self._since = own_now

    def observe(self, own_now: float, *, sign: bool, seen: Seen) -> float:
        """Seconds of own time it has been silent, after this look."""
        if sign or seen is Seen.ALIVE:
            self._since = own_now
        return max(0.0, own_now - self._since)


@dataclass(frozen=True)
class Identity:
    """Which process an agent is, as a process on the same machine can check it (start time: ticks after boot)."""

    boot_id: str
    pid_ns: int
    net_ns: int
    pid: int
    start_time: int

    MAX_TEXT = 200

    def encode(self) -> str:
        return f"{self.boot_id} {self.pid_ns} {self.net_ns} {self.pid} {self.start_time}"

    @classmethod
    def decode(cls, text: str) -> "Identity | None":
        """From a peer (the store may hold anything): five fields in range, else None."""
        if len(text) > cls.MAX_TEXT:
            return None
        parts = text.split(" ")
        if len(parts) != 5 or not parts[0] or len(parts[0]) > 64 or \
                any(c not in "0123456789abcdef-" for c in parts[0]):
            return None
        if not all(p.isascii() and p.isdigit() and len(p) <= 20 for p in parts[1:]):
            return None
        pid_ns, net_ns, pid, start = (int(p) for p in parts[1:])
        if not (0 < pid < 2**31 and 0 <= pid_ns < 2**64 and 0 <= net_ns < 2**64 and 0 <= start < 2**63):
            return None
        return cls(parts[0], pid_ns, net_ns, pid, start)

    def same_machine(self, other: "Identity") -> bool:
        """Whether ``other``'s pid means the same process here (in another network namespace it can be cut off)."""
        return (self.boot_id, self.pid_ns, self.net_ns) == (other.boot_id, other.pid_ns, other.net_ns)


@dataclass(frozen=True)
class Beat:
    """One agent's beat as stored, ``<count> <identity>``; an unparsable value still counts as a change."""

    count: int
    identity: Identity | None

    MAX_BYTES = 256

    def encode(self) -> bytes:
        return f"{self.count} {self.identity.encode() if self.identity else '-'}".encode()

    @classmethod
    def decode(cls, raw: bytes) -> "Beat":
        text = raw[:cls.MAX_BYTES].decode("ascii", errors="replace")
        head, _, rest = text.partition(" ")
        count = int(head) if head.isascii() and head.isdigit() and len(head) < 20 else -1
        return cls(count, Identity.decode(rest) if rest and rest != "-" else None)
