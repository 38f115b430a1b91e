"""One node's evidence for the hang verdict: for each local rank, what the kernel, its stack, its Flight
Recorder and the rank monitor say, gathered within a bound.

/proc states first (``Sample``: scheduler state and CPU share, needing nothing from the process), before
anything touches the ranks; then ask for Flight Recorder dumps, written while the stacks are taken; then the
dumps until the bound. A rank that gives none is left without progress.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from mbr_launch import outside, procstat
from mbr_launch.contract import STACK_FILE_ENV
from mbr_launch.decide.verdict import GroupProgress, ProcState, RankEvidence, StackClass
from mbr_launch.workers import flightrec
from mbr_launch.workers.process import Worker
from mbr_launch.workers.stacks import StackDump, StackTarget, dump_stacks

_POLL = 0.02
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


Rows = Sequence[Mapping[str, Any]]


def gather(workers: Sequence[Worker], *, node: str, group_rank: int, out_dir: Path, stack_method: str,
           bound: float = 2.0, monitor_rows: Rows | Callable[[], Rows | None] | None = None,
           expired: Mapping[int, str] | None = None, window: float = 0.05,
           warn: Callable[[str], None] | None = None) -> list[RankEvidence]:
    """Evidence of every worker (one per local rank), back within about ``bound`` seconds; never raises for a rank.
    ``monitor_rows``: the monitor's rows, or how to get them (then read last). ``expired``: local rank -> the kind
    of deadline that passed. ``warn`` gets one line per dump file that was there but could not be used."""
    deadline = time.monotonic() + bound
    live = [w for w in workers if w.alive]
    # The state first; the CPU share is measured over the gathering itself, which waits anyway.
    kernel = Sample([w.pid for w in live])

    files = {w.local_rank: flightrec.dump_files(w.spec.env, w.rank) for w in live}
    before = {lr: {p: _signature(p) for p in f.all()} for lr, f in files.items()}
    # A stopped or uninterruptible process writes no dump: asking would only wait out the bound.
    mute = {w.local_rank for w in live if kernel.state(w.pid) in _MUTE}
    asked = [w.local_rank for w in live if w.local_rank not in mute
             and flightrec.trigger(flightrec.trigger_file(w.spec.env), flightrec.nccl_pipe(w.spec.env, w.rank))]

    stacks = _stacks(live, out_dir, stack_method, deadline)
    progress, problems = _await_dumps({lr: files[lr] for lr in asked}, before, deadline)
    ranks = {w.local_rank: w.rank for w in live}
    for (lr, path), problem in problems.items():
        if warn is not None:
            warn(f"WARNING: rank {ranks[lr]}'s Flight Recorder dump {path} was not read: {problem}")
    states = kernel.finish(min_window=min(window, bound / 4))

    if callable(monitor_rows):
        monitor_rows = monitor_rows()
    rows = {row.get("local_rank"): row for row in monitor_rows or () if isinstance(row, Mapping)}
    out = []
    for w in sorted(workers, key=lambda w: w.local_rank):
        state, cpu = states.get(w.pid, (ProcState.GONE, None)) if w.alive else (ProcState.GONE, None)
        dump = stacks.get(w.local_rank)
        row = rows.get(w.local_rank, {})
        kind = (expired or {}).get(w.local_rank)
        out.append(RankEvidence(
            rank=w.rank, node=node, group_rank=group_rank, local_rank=w.local_rank, pid=w.pid, state=state,
            cpu=cpu, stack=dump.stack_class if dump else StackClass.NONE, where=dump.where if dump else "",
            collective=dump.collective if dump else "", progress=progress.get(w.local_rank, ()),
            expired=kind is not None, watched=row.get("state") in _SINCE, kind=kind or "", section=_section(row),
            last_heartbeat_age=_freshest(row.get("last_heartbeat_age"), row.get("last_step_age")),
            steps=outside.integer(row.get("steps")),
            stacks_path=str(dump.path) if dump and dump.path else None))
    return out


# The monitor's phases once a client initialised again after an expiry (until then it stays "expired").
_SINCE = ("monitoring", "armed")
_MUTE = (ProcState.STOPPED, ProcState.DISK, ProcState.ZOMBIE, ProcState.GONE)


def _stacks(live: Sequence[Worker], out_dir: Path, method: str, deadline: float) -> dict[int, StackDump]:
    if method == "off" or not live:
        return {}
    targets = [StackTarget(rank=w.rank, local_rank=w.local_rank, pid=w.pid,
                           faulthandler_file=Path(w.spec.env[STACK_FILE_ENV]) if w.spec.env.get(STACK_FILE_ENV)
                           else None) for w in live]
    try:
        dumps = dump_stacks(targets, out_dir, method=method,  # type: ignore[arg-type]
                            timeout=max(0.2, deadline - time.monotonic()))
    except Exception:  # evidence must never block the recovery
        return {}
    return {d.local_rank: d for d in dumps}


def _signature(path: Path) -> tuple[int, int, int] | None:
    """(inode, mtime, size) of the name itself: the shim replaces its file, NCCL writes in place (size changes)."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


Problems = dict[tuple[int, Path], str]


def _await_dumps(files: Mapping[int, flightrec.DumpFiles], before: Mapping[int, Mapping[Path, Any]],
                 deadline: float) -> tuple[dict[int, tuple[GroupProgress, ...]], Problems]:
    """Each asked rank's progress from the dumps written since we asked, until the deadline; and the problems
    worth a line (refused files, and why a rank left without progress gave none). A file is read again only
    when it changed (one half-written reads as nothing), so a hostile one costs one bounded read."""
    out: dict[int, tuple[GroupProgress, ...]] = {}
    read: dict[Path, tuple[Any, flightrec.DumpRead]] = {}  # path -> (signature, its read) as last read
    pending = dict(files)
    while pending:
        for lr, f in list(pending.items()):
            fresh = {}
            for p in f.all():
                sig = _signature(p)
                if sig is None or sig == before[lr].get(p):
                    continue
                if p not in read or read[p][0] != sig:
                    read[p] = (sig, flightrec.load_checked(p, deadline=deadline))
                fresh[p] = read[p][1].data
            if any(fresh.get(p) is not None for p in (f.ours, f.nccl)):
                out[lr] = flightrec.merge([flightrec.progress(data) for data in fresh.values()])
                del pending[lr]
        if not pending or time.monotonic() + _POLL > deadline:
            break
        time.sleep(_POLL)
    problems = {(lr, p): r.problem for lr, f in files.items() for p in f.all()
                if p in read and (r := read[p][1]).problem and (r.refused or lr not in out)}
    return out, problems


def _section(row: Mapping[str, Any]) -> str | None:
    sections = row.get("open_sections")
    if isinstance(sections, (list, tuple)) and sections and isinstance(sections[-1], str):
        return sections[-1]  # the innermost open one
    return None


def _freshest(*ages: Any) -> float | None:
    """The youngest finite age of a sign of life (a heartbeat or an optimizer step); None when there is none."""
    known = [age for age in map(outside.finite, ages) if age is not None]
    return min(known) if known else None
