"""The job-wide hang verdict: every rank's evidence in, the culprit (or "undetermined") out. Pure: no IO.

When one rank stops calling collectives, its peers block in their next collective, so the deadline that fires
first names a rank at random. The evidence (process state, Flight Recorder counters, stacks, the monitor's
view: docs/architecture.md, "Which rank hung") tells them apart; ``judge`` applies the rules strongest first.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

from mbr_launch.decide.verdict_text import (collective_phrase, count_phrase, op_name, place_phrase, ranks_phrase,
                                            verb, waiting_lines, who)


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
    RESTARTING = "restarting"  # in NVRx's in-process Wrapper, between the wrapped function's runs (its restart)
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
    watched: bool = False  # expired, and the NVRx client initialised again since (its deadlines started over)
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
    JOB_STALL = "job_stall"  # every rank stalled alike outside any collective: no rank to blame, the job restarts
    WITHDRAWN = "withdrawn"  # no hang: every rank whose deadline passed is restarting in process
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


# ---- the rules -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Lag:
    """One process group in which some ranks are behind the others."""

    pg: str
    top: int  # the highest last-enqueued sequence number among the group's dumps
    leaders: tuple[int, ...]  # ranks at ``top``
    behind: tuple[int, ...]
    members: Mapping[int, GroupProgress]


_NO_EVIDENCE = "(no process state, stack or Flight Recorder dump)"
_STATE_TEXT = {
    ProcState.STOPPED: "is stopped (SIGSTOP or a debugger: process state T)",
    ProcState.DISK: "is in uninterruptible sleep (process state D: stuck in I/O or a driver call)",
    ProcState.GONE: f"is gone and gave no evidence {_NO_EVIDENCE}",
    ProcState.UNKNOWN: f"gave no evidence {_NO_EVIDENCE}",
}
# States that say nothing about what a live rank is doing (an exited one's crash is handled as a crash).
_SILENT = (ProcState.GONE, ProcState.ZOMBIE, ProcState.UNKNOWN)


def judge(evidence: Sequence[RankEvidence]) -> Verdict:
    """The culprit(s) of a hang from every rank's evidence, or an undetermined verdict that says why."""
    ev = _by_rank(evidence)
    stopped = _stopped(ev)
    if stopped is None and (withdrawn := _withdrawn(ev)) is not None:
        return replace(withdrawn, evidence=tuple(ev))
    found = stopped or _progress_or_stacks(ev)
    if found is None and (stall := _job_stall(ev)) is not None:
        return replace(stall, evidence=tuple(ev))
    found = found or _only_expired(ev)
    if found is None:
        waiting = tuple(e.rank for e in ev if _waits(e))
        return Verdict((), Basis.UNDETERMINED, _why_undetermined(ev), waiting, tuple(ev))
    if len(ev) > 1 and 2 * len(found.culprits) > len(ev):
        # ByteRobust's rule: outliers of a healthy majority are culprits. Without a majority (a shared file
        # system, a bug every rank hits) blaming most of the job would exclude healthy nodes.
        reason = (f"{len(found.culprits)} of {len(ev)} ranks would be culprits ({found.basis.value}: "
                  f"{ranks_phrase(found.culprits)}): no healthy majority to compare against, no rank to blame")
        return Verdict((), Basis.UNDETERMINED, reason, (), tuple(ev))
    return replace(found, evidence=tuple(ev))


def _by_rank(evidence: Sequence[RankEvidence]) -> list[RankEvidence]:
    """Sorted by rank, one entry per rank (the first one given), so every decider reaches the same verdict."""
    seen: dict[int, RankEvidence] = {}
    for e in evidence:
        seen.setdefault(e.rank, e)
    return [seen[r] for r in sorted(seen)]


_EXITED = (ProcState.GONE, ProcState.ZOMBIE)
STEP_DEADLINE = "step"  # the kind of an expired step deadline (monitor.wire.STEP_KIND)


def _has_evidence(e: RankEvidence) -> bool:
    return e.state not in _SILENT or e.stack is not StackClass.NONE or bool(e.progress)


def _pending(e: RankEvidence) -> GroupProgress | None:
    """The process group with a collective of this rank not completed (gloo records no "started")."""
    return next((g for g in sorted(e.progress, key=lambda g: g.pg) if _pending_in(g)), None)


def _waits(e: RankEvidence) -> bool:
    """Waits in a collective (or the in-process restart's barrier): by its stack, else by its counters."""
    return e.stack in _WAITING or (e.stack is StackClass.NONE and _pending(e) is not None)


_WAITING = (StackClass.COLLECTIVE, StackClass.RESTARTING)


def _places(ev: Sequence[RankEvidence], ranks: Sequence[int]) -> dict[str, list[int]]:
    """Where each of ``ranks`` waits, from its pending counters when it has some, else from its stack."""
    described: dict[str, list[int]] = {}
    for e in ev:
        if e.rank in ranks:
            g = _pending(e)
            what = (collective_phrase(g.last_op or e.collective, g.enqueued, g.pg) if g is not None
                    else op_name(e.collective) or "a collective")
            described.setdefault(what, []).append(e.rank)
    return described


def _with_waiting(clauses: list[str], ev: Sequence[RankEvidence], waiting: Sequence[int]) -> str:
    return "; ".join(clauses + ([waiting_lines(_places(ev, waiting))] if waiting else []))


def _stopped(ev: Sequence[RankEvidence]) -> Verdict | None:
    """Rule a, the strongest: a stopped (T) or uninterruptible (D) process waits for no one, and a live rank
    silent while its peers give evidence is evidence itself (a SIGSTOPped rank gives no stack, no dump)."""
    anyone_speaks = any(_has_evidence(e) for e in ev)
    # A GONE rank exited during the inquiry: it hangs nobody, and its exit is handled on its own.
    culprits = [e for e in ev if e.state in (ProcState.STOPPED, ProcState.DISK)
                or (anyone_speaks and e.state is ProcState.UNKNOWN and not _has_evidence(e))]
    if not culprits:
        return None
    blamed = {e.rank for e in culprits}
    waiting = tuple(e.rank for e in ev if e.rank not in blamed and _waits(e))
    clauses = [f"{who(e.rank, e.node)} {_STATE_TEXT[e.state]}" for e in culprits]
    return Verdict(tuple(sorted(blamed)), Basis.STOPPED, _with_waiting(clauses, ev, waiting), waiting)


def _withdrawn(ev: Sequence[RankEvidence]) -> Verdict | None:
    """Before the rules: no hang when every expired rank is restarting in NVRx's Wrapper (which watches its
    own restart), is back with a new client session (its deadlines start over), or has exited (a crash)."""
    expired = [e for e in ev if e.expired]
    # A step deadline (autobeat's) says nothing of the client's session, hence of a restart.
    back = [e.rank for e in expired if e.watched and e.kind != STEP_DEADLINE]
    inside = [e.rank for e in expired if not e.watched and e.stack is StackClass.RESTARTING]
    # (a rank that died of a collective timeout waited for someone: that is evidence of a hang, not an exit)
    gone = [e.rank for e in expired if e.rank not in back + inside and e.state in _EXITED and not _waits(e)]
    if not expired or len(back) + len(inside) + len(gone) < len(expired):
        return None
    said = [f"{ranks_phrase(back)} initialised {verb(len(back), 'its', 'their')} client again"] if back else []
    if inside:
        said.append(f"{ranks_phrase(inside)} {verb(len(inside), 'is', 'are')} in the NVRx in-process restart")
    if gone:
        said.append(f"{ranks_phrase(gone)} exited (handled as a crash)")
    return Verdict((), Basis.WITHDRAWN, "no hang: the deadlines passed during an in-process restart ("
                    + "; ".join(said) + ")")


def _progress_or_stacks(ev: Sequence[RankEvidence]) -> Verdict | None:
    """Rules b and c; where they differ the counters win (a stack is one sample of a thread that moves)."""
    by_counters, by_stacks = _progress(ev), _stacks(ev)
    if by_counters and by_stacks and set(by_counters.culprits) != set(by_stacks.culprits):
        note = (f"; the stacks point at {ranks_phrase(by_stacks.culprits)} instead (outside any collective): "
                "the collective counters win")
        return replace(by_counters, reason=by_counters.reason + note)
    return by_counters or by_stacks


def _lags(ev: Sequence[RankEvidence]) -> list[_Lag]:
    """Process groups with ranks behind the group's top whose leaders wait, keyed by id and global ranks
    (one DP group per TP rank share an id). A missing dump is not "behind"."""
    groups: dict[tuple[str, tuple[int, ...]], dict[int, GroupProgress]] = {}
    for e in ev:
        for g in e.progress:
            groups.setdefault((g.pg, g.ranks), {})[e.rank] = g
    by_rank = {e.rank: e for e in ev}
    lags = []
    for (pg, _), members in sorted(groups.items()):
        if len(members) < 2:
            continue
        top = max(g.enqueued for g in members.values())
        leaders = tuple(sorted(r for r, g in members.items() if g.enqueued == top))
        behind = tuple(sorted(r for r, g in members.items() if g.enqueued < top))
        # Leaders that do not wait may just be ahead (between steps while a slow rank catches up).
        if behind and all(by_rank[r].stack is not StackClass.OUTSIDE or _pending_in(members[r])
                          for r in leaders):
            lags.append(_Lag(pg, top, leaders, behind, members))
    return lags


def _pending_in(g: GroupProgress) -> bool:
    return max(g.started, g.enqueued) > g.completed


def _progress(ev: Sequence[RankEvidence]) -> Verdict | None:
    """Rule b: a rank behind its group never entered the collective its peers wait in. One that leads another
    group waits for someone else (pipeline stages): the culprits end that chain; in a cycle, the minority."""
    lags = _lags(ev)
    if not lags:
        return None
    leading = {r for lag in lags for r in lag.leaders}
    culprits = {r for lag in lags for r in lag.behind} - leading
    if not culprits:
        culprits = {r for lag in lags if 2 * len(lag.behind) < len(lag.members) for r in lag.behind}
    if not culprits:
        return None
    nodes = {e.rank: e.node for e in ev}
    clauses = []
    for rank in sorted(culprits):
        lag = next(lag for lag in lags if rank in lag.behind)
        op = next((op_name(lag.members[r].last_op) for r in lag.leaders if lag.members[r].last_op), "")
        clauses.append(f"{who(rank, nodes[rank])} is behind: {count_phrase(lag.members[rank].enqueued)} enqueued "
                       f"in process group {lag.pg} against {lag.top} on {ranks_phrase(lag.leaders)}"
                       + (f" (waiting in {op} #{lag.top})" if op else ""))
    return Verdict(tuple(sorted(culprits)), Basis.PROGRESS, "; ".join(clauses), tuple(sorted(leading - culprits)))


def _stacks(ev: Sequence[RankEvidence]) -> Verdict | None:
    """Rule c (ByteRobust's): with some ranks waiting in a collective, the ranks outside any are awaited."""
    outside = [e for e in ev if e.stack is StackClass.OUTSIDE]
    inside = tuple(e.rank for e in ev if e.stack in _WAITING)
    if not outside or not inside:
        return None
    clauses = [f"{who(e.rank, e.node)} is outside any collective{place_phrase(e.where, e.cpu)}" for e in outside]
    return Verdict(tuple(e.rank for e in outside), Basis.STACKS, _with_waiting(clauses, ev, inside), inside)


STALL_SHARE = 0.5  # a rank whose last beat is at least this share as old as the expired rank's stalled too


def _job_stall(ev: Sequence[RankEvidence]) -> Verdict | None:
    """Before rule d: every live rank outside any collective, one expired, none progressing (a checkpoint
    write to a stuck file system): the first deadline names a rank at random, so blame none."""
    live = [e for e in ev if e.state not in _EXITED]
    expired = [e for e in live if e.expired]
    if len(live) < 2 or not expired or any(e.stack is not StackClass.OUTSIDE or _waits(e) for e in live):
        return None
    oldest = max((e.last_heartbeat_age for e in expired if e.last_heartbeat_age is not None), default=None)
    # per rank: stalled (True), beating (False), or no age known (None)
    seen = [True if e.expired else None if e.last_heartbeat_age is None or oldest is None
            else e.last_heartbeat_age >= STALL_SHARE * oldest for e in live]
    places = {e.where for e in live}
    same = len(places) == 1 and "" not in places
    if False in seen or (not same and None in seen):
        return None  # someone progresses, or only rule d can tell
    ages = ", ".join(f"{e.rank}: {e.last_heartbeat_age:.0f} s" for e in live if e.last_heartbeat_age is not None)
    return Verdict((), Basis.JOB_STALL,
                    f"every rank {f'is in `{places.pop()}`' if same else 'is outside any collective'} "
                    f"({ranks_phrase([e.rank for e in live])}; {ranks_phrase([e.rank for e in expired])} past a "
                    f"deadline{f'; last heartbeat {ages} ago' if ages else ''}): a job-wide stall (a shared file "
                    "system, a checkpoint write?), no rank or node to blame")


def _only_expired(ev: Sequence[RankEvidence]) -> Verdict | None:
    """Rule d: the one rank past its deadline while every other's stack shows it outside any collective (a
    peer merely not expired yet may be blocked on it)."""
    expired = [e for e in ev if e.expired]
    if len(expired) != 1:
        return None
    one = expired[0]
    if any(e.stack is not StackClass.OUTSIDE for e in ev if e is not one and e.state not in _EXITED):
        return None  # (ranks that exited meanwhile wait for nobody)
    details = ", ".join(([f"in section '{one.section}'"] if one.section else [])
                        + ([f"in `{one.where}`"] if one.where else []))
    others = [e.rank for e in ev if e is not one and e.state not in _EXITED]
    reason = (f"{who(one.rank, one.node)} is the only rank past its {one.kind + ' ' if one.kind else ''}deadline"
              + (f" ({details})" if details else "")
              + (f"; {ranks_phrase(others)} {verb(len(others), 'runs', 'run')} outside any collective"
                 if others else ""))
    return Verdict((one.rank,), Basis.ONLY_EXPIRED, reason)


def _why_undetermined(ev: Sequence[RankEvidence]) -> str:
    """Rule e: nothing names a rank; say what was seen."""
    if not ev:
        return "no evidence: no rank was reported"
    if not any(_has_evidence(e) for e in ev):
        return f"no evidence from any rank {_NO_EVIDENCE}"
    waiting = [e.rank for e in ev if _waits(e)]
    if len(waiting) == len(ev):
        places = _places(ev, waiting)
        if len(places) == 1:
            return f"every rank waits in {next(iter(places))}: a communication hang, no rank to blame"
        undumped = [e.rank for e in ev if not e.progress]
        if undumped and len(undumped) < len(ev):  # the counters could have told, had every rank dumped
            return (f"every rank waits in a collective ({waiting_lines(places)}); no Flight Recorder dump from "
                    f"{ranks_phrase(undumped)} to compare, no rank to blame")
        return (f"every rank waits in a collective ({waiting_lines(places)}) and none is behind: a "
                "communication hang or collectives called in a different order, no rank to blame")
    expired = [e.rank for e in ev if e.expired]
    if all(e.stack is StackClass.OUTSIDE for e in ev):
        past = f"{ranks_phrase(expired)} past a deadline" if expired else "no rank past a deadline"
        return f"every rank is outside any collective, {past}: nothing tells them apart"
    silent = [e.rank for e in ev if e.stack is StackClass.NONE and not _waits(e)]
    seen = ([waiting_lines(_places(ev, waiting))] if waiting else []) + ([f"no stack from {ranks_phrase(silent)}"]
                                                                 if silent else [])
    return "the evidence names no rank: " + "; ".join(seen)

