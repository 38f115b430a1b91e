"""A hang, from the first expired deadline to the verdict and what this node does about it.

An expiry kills nothing: it opens a job-wide inquiry (``cluster.inquiry``), every node gathers its ranks'
evidence (``workers.evidence``), the opener's node judges (``decide.verdict``), and every node acts on the
verdict: the culprit's node stops it and runs the failure path; an undetermined verdict restarts the job.
What the store says cannot kill or restart on its own (docs/security.md): an inquiry without an expired rank
is withdrawn (``judge_inquiry``), another node's verdict stops a rank here only when this node's evidence
bears it out (``_doubt``), else ``overdue`` restarts the job blaming no node, and an expiry in the quiet time
after a verdict is postponed, never dropped (``resume_postponed``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Mapping, Sequence

from mbr_launch.agent.context import Context, Postponed
from mbr_launch.agent.failures import handle_failure
from mbr_launch.agent.messages import InquiryOpened, RankExpired, RoundResult
from mbr_launch.cluster.inquiry import Opener
from mbr_launch.cluster.round import Round
from mbr_launch.decide.causes import Cause
from mbr_launch.decide.verdict import Basis, ProcState, RankEvidence, StackClass, Verdict, judge
from mbr_launch.decide.verdict_codec import evidence_to_dict
from mbr_launch.decide.verdict_text import ranks_phrase
from mbr_launch.monitor.wire import STEP_KIND
from mbr_launch.report.summary import FailureRecord
from mbr_launch.workers.evidence import gather as evidence_of
from mbr_launch.workers.process import Worker

VERDICT_SLACK = 2.0  # seconds a node that does not decide waits for the verdict beyond the gathering bound
TIMED_OUT = "collective_timeout"  # the evidence's ``kind`` for a rank that died of a collective timeout


def on_expiry(ctx: Context, rnd: Round, event: RankExpired) -> RoundResult | None:
    worker = ctx.group.by_local_rank(event.local_rank)
    if worker is None or not worker.alive:
        return None  # already gone: its exit is (or will be) handled as a crash
    ctx.log.emit("hang", round=rnd.index, rank=event.rank, local_rank=event.local_rank, pid=event.pid, kind=event.kind,
                 section=event.section, timeout=event.timeout, elapsed=event.elapsed,
                 last_heartbeat_age=event.last_heartbeat_age, open_sections=list(event.open_sections) or None)
    ctx.current.inquiry.expired[event.local_rank] = event
    if ctx.current.inquiry.quiet(ctx.clock()):
        # A peer of the culprit named a moment ago, or a new hang: judged when the quiet time ends (the
        # monitor tells each expiry only once).
        ctx.current.inquiry.postponed.setdefault(event.local_rank, Postponed(event, worker.pid, ctx.clock()))
        return None
    return _open(ctx, rnd, event)


def resume_postponed(ctx: Context, rnd: Round) -> RoundResult | None:
    """After the quiet time, a postponed expiry opens the inquiry if its rank is the same process, alive and
    unmoved since; not while a culprit elsewhere is being stopped (``overdue`` covers that)."""
    postponed, now = ctx.current.inquiry.postponed, ctx.clock()
    if not postponed or ctx.current.inquiry.quiet(now) or ctx.current.inquiry.elsewhere is not None:
        return None
    ctx.current.inquiry.postponed = {}
    ages = ctx.monitor.ages(list(postponed))
    due = []
    for local_rank, p in sorted(postponed.items(), key=lambda item: item[1].at):
        worker = ctx.group.by_local_rank(local_rank)
        if worker is None or not worker.alive or worker.pid != p.pid:
            continue  # gone or restarted since: its exit (or its new process) is handled on its own
        if (age := ages.get(local_rank)) is not None and age < now - p.at:
            ctx.current.inquiry.expired.pop(local_rank, None)
            continue
        due.append(p)
    if not due:
        return None
    first = due[0].event
    ctx.say(f"rank {first.rank}'s deadline passed {now - due[0].at:.1f} s ago, in the quiet time after the last "
            "verdict, and it has not moved since: judging it now")
    return _open(ctx, rnd, first)


def _open(ctx: Context, rnd: Round, event: RankExpired) -> RoundResult | None:
    return _act(ctx, rnd, _verdict(ctx, rnd, _opener(ctx, rnd, event.rank, event.kind)))


def _opener(ctx: Context, rnd: Round, rank: int | None, kind: str) -> Opener:
    """Open this round's next inquiry; the opener that won."""
    with ctx.store_call("opening a hang inquiry"):
        return ctx.cluster.open_inquiry(rnd, Opener(ctx.current.inquiry.number, rnd.group_rank, rank, kind))


def on_opened(ctx: Context, rnd: Round, event: InquiryOpened) -> RoundResult | None:
    """Another node opened an inquiry: join it, unless this node already did."""
    if event.opener.number != ctx.current.inquiry.number:
        return None
    return _act(ctx, rnd, _verdict(ctx, rnd, event.opener))


def on_collective_timeout(ctx: Context, rnd: Round, failed: Sequence[Worker],
                          lines: Mapping[int, str]) -> tuple[bool, RoundResult | None]:
    """Local ranks died of a collective timeout, waiting for another rank. (True, result) when the verdict
    names a culprit; (False, None) leaves them to the crash path."""
    waited = [RankEvidence(rank=w.rank, node=ctx.node, group_rank=rnd.group_rank, local_rank=w.local_rank,
                           pid=w.pid, state=ProcState.GONE, stack=StackClass.COLLECTIVE,
                           collective="a collective that timed out", where=lines[w.local_rank][:160],
                           expired=True, kind=TIMED_OUT) for w in failed]
    ctx.current.inquiry.timed_out = {w.rank: lines[w.local_rank] for w in failed}
    found = _verdict(ctx, rnd, _opener(ctx, rnd, failed[0].rank, TIMED_OUT), waited)
    if not found.verdict.determined:
        return False, None
    return True, _act(ctx, rnd, found)


@dataclass(frozen=True)
class _Found:
    verdict: Verdict
    local: list[RankEvidence]
    decider: bool  # this node opened the inquiry, and judged it
    doubt: str | None = None  # why this node does not stop the ranks here that the verdict blames


def _verdict(ctx: Context, rnd: Round, opener: Opener, extra: Sequence[RankEvidence] = ()) -> _Found:
    """Gather and publish this node's evidence; decide (the opener's node) or wait for the verdict."""
    number, began, bound = opener.number, ctx.clock(), ctx.cfg.monitor.inquiry_timeout
    decider = opener.group_rank == rnd.group_rank
    ctx.current.inquiry.number += 1
    ctx.current.inquiry.postponed = {}  # their expiries are in this inquiry's evidence (``inquiry.expired``)
    if ctx.current.watch is not None:
        ctx.current.watch.watch_inquiry(ctx.current.inquiry.number)
    own = ctx.gather_evidence(rnd, bound) if ctx.gather_evidence else gather(ctx, rnd, bound)
    gathered = [_with_expiry(e, ctx.current.inquiry.expired.get(e.local_rank)) for e in own]
    known = {e.rank: e for e in extra}  # what this node knows better than /proc (why a rank exited) wins
    local = [known.pop(e.rank, e) for e in gathered] + list(known.values())
    with ctx.store_call("publishing hang evidence"):
        ctx.cluster.publish_evidence(rnd, number, local)
    judged: Verdict | None  # the verdict as this node judged it, if it did
    if decider:
        with ctx.store_call("collecting hang evidence"):
            evidence, silent = ctx.cluster.collect_evidence(rnd, number, deadline=began + bound)
        judged = _silence_noted(judge_inquiry(evidence), silent)
        with ctx.store_call("publishing the hang verdict"):
            verdict = ctx.cluster.publish_verdict(rnd, number, judged)
    else:
        with ctx.store_call("waiting for the hang verdict"):
            stored = ctx.cluster.wait_verdict(rnd, number, deadline=began + bound + VERDICT_SLACK)
        verdict = stored if stored is not None else _silence_noted(judge_inquiry(local), [opener.group_rank])
        judged = None if stored is not None else verdict
    # A verdict from the store is checked against what this node saw; its own judgement needs no check.
    doubt = None if verdict is judged else _doubt(ctx, verdict, local, began)
    if verdict.basis is not Basis.WITHDRAWN:  # after a withdrawn one, the next expiry is judged afresh
        ctx.current.inquiry.quiet_until = ctx.clock() + ctx.cfg.monitor.hang_kill_grace + bound + VERDICT_SLACK
    _record(ctx, rnd, number, verdict, local, opener=opener, seconds=ctx.clock() - began, doubt=doubt)
    return _Found(verdict, local, decider, doubt)


def gather(ctx: Context, rnd: Round, bound: float) -> list[RankEvidence]:
    # The rows are read after the stacks: a client initialised again meanwhile counts as watched.
    return evidence_of(ctx.group.workers, node=ctx.node, group_rank=rnd.group_rank,
                       out_dir=ctx.run_dir / f"attempt_{rnd.index}" / "stacks",
                       stack_method=ctx.cfg.monitor.stack_dump, bound=bound, monitor_rows=ctx.monitor.rows,
                       warn=ctx.say)  # a refused dump file: its line starts "WARNING:"


def _doubt(ctx: Context, verdict: Verdict, local: Sequence[RankEvidence], began: float) -> str | None:
    """Why this node does not stop its ranks a stored verdict blames (None: it does): its own evidence does not
    bear it out, or the rank made a heartbeat or step since gathering began (a hung rank makes neither)."""
    mine = [e for e in local if e.rank in verdict.culprits]
    if not mine:
        return None
    if (why := unsupported(verdict, local)) is not None:
        return why
    # A rank found stopped cannot step: a beat since is the one its stack dump let through (faulthandler
    # resumes it for the dump).
    running = [e for e in mine if e.state is not ProcState.STOPPED]
    ages, waited = ctx.monitor.ages([e.local_rank for e in running]), ctx.clock() - began
    moved = [(e.rank, ages[e.local_rank]) for e in running if e.local_rank in ages and ages[e.local_rank] < waited]
    return "; ".join(f"rank {rank} made a heartbeat or step {age:.1f} s ago, during the inquiry"
                     for rank, age in moved) or None


NOTHING_EXPIRED = "no hang: no rank of any node is past a deadline"


def judge_inquiry(evidence: Sequence[RankEvidence]) -> Verdict:
    """``judge``, withdrawn when no rank is past a deadline: an agent opens an inquiry only on an expiry, so one
    without came from no agent (anyone who reaches the store could buy a restart per write)."""
    if not any(e.expired for e in evidence):
        return Verdict((), Basis.WITHDRAWN, f"{NOTHING_EXPIRED} (the inquiry was opened without an expiry)", (),
                       tuple(sorted(evidence, key=lambda e: e.rank)))
    return judge(evidence)


def unsupported(verdict: Verdict, own: Sequence[RankEvidence]) -> str | None:
    """Why this node's evidence does not bear out a stored verdict blaming ranks here (None: it does): the
    verdict's evidence of a culprit here must be what this node saw of it, else it judged another process or
    facts this node never reported, and stopping the rank would stop a healthy one."""
    mine = {e.rank: e for e in own}
    carried = {e.rank: e for e in verdict.evidence}
    for rank in verdict.culprits:
        if rank not in mine:
            continue
        said = carried.get(rank)
        if said is None:
            return f"the verdict carries no evidence of rank {rank}"
        seen, told = _facts(mine[rank]), _facts(said)
        differs = [name for name in seen if seen[name] != told[name]]
        if differs:
            return (f"the verdict's evidence of rank {rank} is not this node's: "
                    + ", ".join(f"{n} {told[n]} (here {seen[n]})" for n in differs))
    return None


def _facts(e: RankEvidence) -> dict[str, object]:
    """What the rules read of one rank's evidence (no strings: the store's decoder shortens them)."""
    return {"pid": e.pid, "state": e.state.value, "stack": e.stack.value, "expired": e.expired,
            "collective counts": sorted((g.enqueued, g.started, g.completed) for g in e.progress)}


def overdue(ctx: Context, rnd: Round) -> RoundResult | None:
    """The culprit's node had its time to stop the round and did not: restart the job, blaming no node."""
    if ctx.current.inquiry.elsewhere is None or ctx.clock() < ctx.current.inquiry.elsewhere_by:
        return None
    reason, ctx.current.inquiry.elsewhere = ctx.current.inquiry.elsewhere, None
    record = FailureRecord(round=rnd.index, rank=-1, local_rank=-1, node=ctx.node, group_rank=rnd.group_rank,
                           cause=Cause.HANG, status=None,
                           detail=f"the culprit's node did not stop the round after the verdict: {reason}")
    return handle_failure(ctx, rnd, [record], culprit_known=False)


def _with_expiry(evidence: RankEvidence, event: object) -> RankEvidence:
    """This node's expiry of the rank, in its evidence (``watched`` means nothing for autobeat's step deadline)."""
    if not isinstance(event, RankExpired):
        return dataclasses.replace(evidence, watched=False)
    return dataclasses.replace(evidence, expired=True, kind=event.kind, section=event.section,
                               watched=evidence.watched and event.kind != STEP_KIND,
                               last_heartbeat_age=event.last_heartbeat_age
                               if event.last_heartbeat_age is not None else evidence.last_heartbeat_age)


def _silence_noted(verdict: Verdict, silent: Sequence[int]) -> Verdict:
    """An undetermined verdict names the nodes that sent no evidence in time; a named culprit stands."""
    if not silent or verdict.determined:
        return verdict
    nodes = ", ".join(str(g) for g in silent)
    return dataclasses.replace(verdict, reason=f"{verdict.reason}; no evidence from the node(s) of group rank {nodes}")


def _trigger(ctx: Context, opener: Opener) -> str:
    expired = ctx.current.inquiry.expired.values()
    event = next((e for e in expired if isinstance(e, RankExpired) and e.rank == opener.rank), None)
    if opener.rank in ctx.current.inquiry.timed_out:
        return f"rank {opener.rank} died of a collective timeout: {ctx.current.inquiry.timed_out[opener.rank]}"
    if event is not None:
        return f"rank {event.rank} {describe_expiry(event)}"
    return f"rank {opener.rank}'s {opener.kind} deadline passed" if opener.rank is not None else ""


def _record(ctx: Context, rnd: Round, number: int, verdict: Verdict, local: Sequence[RankEvidence], *,
            opener: Opener, seconds: float, doubt: str | None) -> None:
    where = {e.rank: e for e in verdict.evidence}
    ctx.log.emit("verdict", round=rnd.index, inquiry=number, culprits=list(verdict.culprits),
                 nodes=sorted({where[r].node for r in verdict.culprits if r in where}),
                 group_ranks=sorted({where[r].group_rank for r in verdict.culprits if r in where}),
                 basis=verdict.basis.value, reason=verdict.reason, waiting=list(verdict.waiting),
                 decider=opener.group_rank, seconds=round(seconds, 3), evidence=[evidence_to_dict(e) for e in local],
                 **({"refused": doubt} if doubt else {}))
    stacks = [e.stacks_path for e in local if e.stacks_path]
    if stacks:
        ctx.log.emit("stacks", round=rnd.index, method=[ctx.cfg.monitor.stack_dump], paths=stacks)
    trigger = _trigger(ctx, opener)
    head = {Basis.WITHDRAWN: "", Basis.JOB_STALL: "HANG, job-wide: "}.get(
        verdict.basis, "HANG: " if verdict.determined else "HANG, culprit undetermined: ")
    ctx.say(head + verdict.reason + (f" (inquiry opened when {trigger})" if trigger else ""))


def _act(ctx: Context, rnd: Round, found: _Found) -> RoundResult | None:
    """The culprit's node stops it and runs the failure path; the decider restarts the job for an undetermined
    verdict; other nodes (and one in doubt) wait for the culprit's node, or ``overdue``."""
    verdict, local = found.verdict, found.local
    if verdict.basis is Basis.WITHDRAWN:
        return None  # the ranks restart in process: nothing hung, nothing to stop
    for feature in ctx.features:
        feature.detected(ctx)  # the verdict is the detection; the culprit's kill grace is restart time
    mine = {e.rank: e for e in local}
    culprits = [mine[r] for r in verdict.culprits if r in mine and ctx.group.by_local_rank(mine[r].local_rank)]
    if culprits and found.doubt is not None:
        ctx.say(f"not stopping {ranks_phrase([e.rank for e in culprits])} for that verdict: {found.doubt}")
        culprits = []
        verdict = dataclasses.replace(verdict, reason=f"{verdict.reason} (not borne out here: {found.doubt})")
    if verdict.determined and not culprits:
        ctx.current.inquiry.elsewhere = verdict.reason  # local ranks that die now die of the culprit's stop
        cfg = ctx.cfg
        ctx.current.inquiry.elsewhere_by = (ctx.clock() + cfg.monitor.hang_kill_grace + cfg.workers.shutdown_timeout
                                    + cfg.rendezvous.peer_timeout)
        return None
    if not verdict.determined and not found.decider:
        return None
    records = [_record_of(ctx, rnd, e, verdict) for e in culprits] or [
        FailureRecord(round=rnd.index, rank=-1, local_rank=-1, node=ctx.node, group_rank=rnd.group_rank,
                      cause=Cause.HANG, status=None,
                      detail=f"hang, {'job-wide' if verdict.basis is Basis.JOB_STALL else 'culprit undetermined'}: "
                             f"{verdict.reason}")]
    if culprits:
        ctx.group.stop(rnd, local_ranks=[e.local_rank for e in culprits], grace=ctx.cfg.monitor.hang_kill_grace)
    return handle_failure(ctx, rnd, records, culprit_known=verdict.determined)


def _record_of(ctx: Context, rnd: Round, evidence: RankEvidence, verdict: Verdict) -> FailureRecord:
    worker = ctx.group.by_local_rank(evidence.local_rank)
    expired = ctx.current.inquiry.expired.get(evidence.local_rank)
    detail = verdict.reason + (f" [its own deadline: {describe_expiry(expired)}]" if isinstance(expired, RankExpired)
                               else "")
    return FailureRecord(round=rnd.index, rank=evidence.rank, local_rank=evidence.local_rank, node=ctx.node,
                         group_rank=rnd.group_rank, cause=Cause.HANG, status=None,
                         pid=worker.pid if worker else evidence.pid, section=evidence.section, detail=detail,
                         stacks=evidence.stacks_path, stack_summary=evidence.where or None)


EXPIRY_TEXT = {  # the ``kind`` of the monitor's ``expired`` event, for people
    "initial_heartbeat": "sent no first heartbeat",
    "heartbeat": "sent no heartbeat",
    "section": "stayed in section '{section}'",
    "out_of_section": "stayed outside any section",
    "step": "finished no optimizer step",
}


def describe_expiry(event: RankExpired) -> str:
    text = EXPIRY_TEXT.get(event.kind, event.kind).format(section=event.section)
    parts = [f"{text} for {event.elapsed:.2f} s (timeout {event.timeout:g} s)"
             if event.elapsed is not None and event.timeout is not None else text]
    if event.last_heartbeat_age is not None:
        parts.append(f"last heartbeat {event.last_heartbeat_age:.1f} s ago")
    if event.open_sections:
        parts.append(f"open sections: {', '.join(event.open_sections)}")
    return "; ".join(parts)
