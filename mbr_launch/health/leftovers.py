"""``--ft-check-remaining-processes``: after a round's workers were stopped, what of theirs is still alive.

The stop already killed what it could tell was a worker's (``workers.strays``), so this finds what got past
it (``find``: pure over a process table). Reported, never killed, as NVRx does (docs/node-checks.md).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Collection, Mapping, Sequence

from mbr_launch import procstat
from mbr_launch.health.gpuowners import command_of
from mbr_launch.workers.strays import Proc, descendants

SHOWN = 20  # processes named in the line (NVRx logs as many); the event has up to EVENT_MAX
EVENT_MAX = 100
_CMDLINE = 200  # characters of a command line kept


@dataclass(frozen=True)
class Leftover:
    pid: int
    ppid: int
    pgid: int
    why: str
    cmdline: str = ""

    def to_event(self) -> dict[str, object]:
        return {"pid": self.pid, "ppid": self.ppid, "pgid": self.pgid, "why": self.why, "cmdline": self.cmdline}


def markers(run_id: str, master_port: int, group_rank: int) -> tuple[bytes, ...]:
    """Environment entries every worker of this agent's round carries, and nothing else does."""
    return (f"TORCHELASTIC_RUN_ID={run_id}".encode(), f"MASTER_PORT={master_port}".encode(),
            f"GROUP_RANK={group_rank}".encode())


def find(table: Mapping[int, Proc], *, me: int, workers: Collection[int], keep: Collection[int],
         environ_of: Callable[[int], Sequence[bytes]], marks: Collection[bytes]) -> list[Leftover]:
    """The stopped round's processes still alive in ``table``: in a stopped worker's group (stuck past
    SIGKILL), orphans adopted by the launcher, carriers of the round's worker environment, and their
    descendants. ``keep``: what the launcher holds (standbys, the rank monitor)."""
    skip = {me, *keep}
    live = {pid: proc for pid, proc in table.items() if not proc.zombie and pid not in skip}
    groups = set(workers)
    found: dict[int, str] = {}
    for pid, proc in sorted(live.items()):
        if proc.pgid in groups:
            found[pid] = f"in the process group of stopped worker {proc.pgid}"
        elif proc.ppid == me:
            found[pid] = "an orphan of a worker's processes, adopted by the launcher"
        elif marks and all(m in environ_of(pid) for m in marks):
            found[pid] = "carries this round's worker environment"
    for root in list(found):
        for pid in sorted(descendants(live, [root])):
            found.setdefault(pid, f"a descendant of {root}")
    return [Leftover(pid, live[pid].ppid, live[pid].pgid, found[pid]) for pid in sorted(found)]


def environ_of(pid: int) -> list[bytes]:
    return procstat.environ(pid) or []  # [] when gone, or another user's


def cmdline_of(pid: int) -> str:
    text = command_of(pid) or ""
    return text if len(text) <= _CMDLINE else text[:_CMDLINE] + "..."


def with_cmdlines(found: Sequence[Leftover], read: Callable[[int], str] = cmdline_of) -> list[Leftover]:
    return [replace(f, cmdline=read(f.pid)) for f in found]


def line(found: Sequence[Leftover], round_index: int) -> str:
    shown = "; ".join(f"pid {f.pid} `{f.cmdline or '?'}` ({f.why})" for f in found[:SHOWN])
    more = f"; and {len(found) - SHOWN} more" if len(found) > SHOWN else ""
    count = f"{len(found)} process{'es' if len(found) != 1 else ''}"
    return (f"WARNING: {count} of round {round_index} still alive after its workers were stopped: {shown}{more} "
            "(--ft-check-remaining-processes; left running)")
