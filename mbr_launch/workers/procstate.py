"""What the kernel says about a rank: its scheduler state and how much CPU it burns, from /proc/<pid>/stat.

Needs nothing from the process: a stopped (T) or uninterruptible (D) rank gives no stack and no dump, and
one spinning while its peers sleep in a collective is telling. Read before anything else touches the ranks.
"""

from __future__ import annotations

import os
import time
from typing import Iterable

from mbr_launch import procstat
from mbr_launch.decide.verdict import ProcState

_STATES = {"R": ProcState.RUNNING, "S": ProcState.SLEEPING, "I": ProcState.SLEEPING, "D": ProcState.DISK,
           "T": ProcState.STOPPED, "t": ProcState.STOPPED, "Z": ProcState.ZOMBIE, "X": ProcState.ZOMBIE,
           "x": ProcState.ZOMBIE}
_TICKS = os.sysconf("SC_CLK_TCK")


def read_stat(pid: int) -> tuple[ProcState, int] | None:
    """(state, utime + stime in clock ticks), or None when the process is gone."""
    stat = procstat.read(pid)
    return None if stat is None else (_STATES.get(stat.state, ProcState.UNKNOWN), stat.cpu_ticks)


class Sample:
    """Each pid's state and CPU time now; ``finish`` gives the CPU share over whatever the caller did since."""

    def __init__(self, pids: Iterable[int]) -> None:
        self.pids = list(pids)
        self.start = time.monotonic()
        self.first = {pid: read_stat(pid) for pid in self.pids}

    def state(self, pid: int) -> ProcState:
        first = self.first.get(pid)
        return ProcState.GONE if first is None else first[0]

    def finish(self, min_window: float = 0.05) -> dict[int, tuple[ProcState, float | None]]:
        """(state at the start, CPU share since: 1.0 = one core busy; None when it vanished meanwhile)."""
        if any(v is not None for v in self.first.values()):
            time.sleep(max(0.0, min_window - (time.monotonic() - self.start)))  # a tick is 10 ms
        return _shares(self.pids, self.first, max(time.monotonic() - self.start, 1e-6))


def sample(pids: Iterable[int], window: float = 0.2) -> dict[int, tuple[ProcState, float | None]]:
    """Each pid's state at the start of the window and its CPU share over the window."""
    return Sample(pids).finish(min_window=window)


def _shares(pids: list[int], first: dict[int, tuple[ProcState, int] | None],
            elapsed: float) -> dict[int, tuple[ProcState, float | None]]:
    out: dict[int, tuple[ProcState, float | None]] = {}
    for pid in pids:
        before = first[pid]
        if before is None:
            out[pid] = (ProcState.GONE, None)
            continue
        after = read_stat(pid)
        cpu = None if after is None else max(0, after[1] - before[1]) / _TICKS / elapsed
        out[pid] = (before[0], None if cpu is None else round(cpu, 3))
    return out
