"""``--ft-check-remaining-processes``: after a round's workers were stopped, what of theirs is still alive.

ft_launcher 0.6/0.7 lists, after its stop, the processes still in the stopped workers' process groups and
logs them (pid, ppid, pgid, name, status, cmdline; 20 at most); it kills nothing more. The stop here
already kills what it can tell is a worker's (``workers.strays``: the group, descendants that left it, orphans
carrying the run's environment), so what this finds is what got past it:

1. a process still in a stopped worker's process group (stuck in the kernel past SIGKILL);
2. a child of the launcher it did not start: an orphan of a worker's tree, handed to the launcher as the
   subreaper, whose environment no longer names the run (it cleared or replaced it);
3. a process anywhere that carries this round's worker environment (run id, MASTER_PORT and GROUP_RANK of
   the round): one that escaped to another subreaper, or a launcher that could not be one;
4. the descendants of those.

They are reported (one line, and a ``leftovers`` event), not killed: like NVRx, the check tells what a stop
missed; the processes are the user's to look at. ``find`` is pure over a process table and an environment
reader.
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
    """The stopped round's processes still alive in ``table``. ``workers``: the stopped workers' pids (each
    led its own process group); ``keep``: what the launcher started and holds (standbys, the rank monitor)."""
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
    """The one line that says what survived the stop of round ``round_index``."""
    shown = "; ".join(f"pid {f.pid} `{f.cmdline or '?'}` ({f.why})" for f in found[:SHOWN])
    more = f"; and {len(found) - SHOWN} more" if len(found) > SHOWN else ""
    count = f"{len(found)} process{'es' if len(found) != 1 else ''}"
    return (f"WARNING: {count} of round {round_index} still alive after its workers were stopped: {shown}{more} "
            "(--ft-check-remaining-processes; left running)")
