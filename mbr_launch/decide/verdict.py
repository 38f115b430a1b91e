"""The job-wide hang verdict: every rank's evidence in, the culprit (or "undetermined") out. Pure: no IO.

When one rank stops calling collectives, its peers block in their next collective within the same step, so
every heartbeat stops at about the same moment and the deadline that fires first names a rank at random.
The evidence tells them apart (the signals Ray's NCCL hang detector and ByteRobust use):
- collective progress from Flight Recorder: per process group, the rank whose last enqueued collective is
  behind its peers' never entered the collective they wait in;
- stacks: a rank outside any collective while its peers wait in one;
- process state: a stopped (T) or uninterruptible (D) rank, or one that gives no evidence at all;
- the monitor's view: last heartbeat, steps, the open section.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class ProcState(enum.Enum):
    RUNNING = "running"  # R (on CPU or runnable)
    SLEEPING = "sleeping"  # S: waiting (a collective, a lock, time.sleep, I/O)
    DISK = "disk"  # D: uninterruptible (I/O, a driver call)
    STOPPED = "stopped"  # T/t: SIGSTOP, a debugger
    ZOMBIE = "zombie"  # Z or X
    GONE = "gone"  # no such process
    UNKNOWN = "unknown"


class StackClass(enum.Enum):
    COLLECTIVE = "collective"  # waiting in a collective, work.wait(), a CUDA synchronize or a store call
    OUTSIDE = "outside"  # anywhere else (user code, a DataLoader, time.sleep, a busy loop)
    NONE = "none"  # no stack could be taken


@dataclass(frozen=True)
class GroupProgress:
    """One process group's counters in one rank's Flight Recorder dump (-1: none yet)."""

    pg: str  # the process group's id in the dump ("0" is the default group)
    enqueued: int
    started: int
    completed: int
    ranks: tuple[int, ...] = ()  # global ranks of the group, when the dump says
    last_op: str = ""  # e.g. "all_reduce" (of the last enqueued collective)


@dataclass(frozen=True)
class RankEvidence:
    rank: int
    node: str
    group_rank: int
    local_rank: int
    pid: int | None
    state: ProcState = ProcState.UNKNOWN
    cpu: float | None = None  # share of one CPU used over the sampling window
    stack: StackClass = StackClass.NONE
    where: str = ""  # the innermost frame of the main thread, e.g. "sleep at train.py:42"
    collective: str = ""  # with StackClass.COLLECTIVE: what it waits in ("all_reduce", "barrier", ...)
    progress: tuple[GroupProgress, ...] = ()  # empty: no Flight Recorder dump
    expired: bool = False  # a deadline of this rank passed (the monitor's verdict)
    kind: str = ""  # which deadline (heartbeat, section, step, ...)
    section: str | None = None
    last_heartbeat_age: float | None = None
    steps: int | None = None  # optimizer steps made (autobeat), when known
    stacks_path: str | None = None


class Basis(enum.Enum):
    """What the verdict rests on (the strongest rule that decided)."""

    STOPPED = "stopped"  # the process is stopped / uninterruptible / gave no evidence
    PROGRESS = "progress"  # Flight Recorder: behind its peers in a process group
    STACKS = "stacks"  # outside any collective while the peers wait in one
    ONLY_EXPIRED = "only_expired"  # the only rank whose deadline passed, the others still progress
    UNDETERMINED = "undetermined"


@dataclass(frozen=True)
class Verdict:
    culprits: tuple[int, ...]  # global ranks; empty when undetermined
    basis: Basis
    reason: str  # one line for the console, e.g. "rank 5 on n2 is outside any collective (in ...); ranks 0-4,6,7 wait in all_reduce #183 of process group 0"
    waiting: tuple[int, ...] = ()  # ranks seen waiting for the culprit(s)
    evidence: tuple[RankEvidence, ...] = field(default=(), repr=False)

    @property
    def determined(self) -> bool:
        return bool(self.culprits)
