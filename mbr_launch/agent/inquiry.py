"""A hang, from the first expired deadline to the verdict and what this node does about it.

The monitor's expiry names the rank whose deadline fired first; in a synchronous job that is as often a rank
waiting for the culprit as the culprit itself. So nothing is killed yet: the expiry opens a job-wide inquiry
(``cluster.inquiry``), every node gathers its ranks' evidence within ``--hang-inquiry-timeout``
(``workers.evidence``), the opener's node judges (``decide.verdict``) and publishes the verdict, and every
node acts on it: the culprit's node stops the culprit and runs the failure path (restart scope, node failure
counts and exclusion follow the culprit); an undetermined verdict restarts the job and blames no node.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

from mbr_launch.agent.context import Context
from mbr_launch.agent.failures import handle_failure
from mbr_launch.agent.messages import InquiryOpened, RankExpired, RoundResult
from mbr_launch.cluster.inquiry import Opener
from mbr_launch.cluster.round import Round
from mbr_launch.decide.causes import Cause
from mbr_launch.decide.verdict import Basis, ProcState, RankEvidence, StackClass, Verdict, judge
from mbr_launch.decide.verdict_codec import evidence_to_dict
from mbr_launch.monitor.wire import STEP_KIND
from mbr_launch.report.summary import FailureRecord
from mbr_launch.workers.process import Worker

# Seconds a node that does not decide waits for the verdict beyond the gathering bound.
VERDICT_SLACK = 2.0
TIMED_OUT = "collective_timeout"  # the evidence's ``kind`` for a rank that died of a collective timeout


def on_expiry(ctx: Context, rnd: Round, event: RankExpired) -> RoundResult | None:
    worker = ctx.group.by_local_rank(event.local_rank)
    if worker is None or not worker.alive:
        return None  # already gone: its exit is (or will be) handled as a crash
    ctx.log.emit("hang", round=rnd.index, rank=event.rank, local_rank=event.local_rank, pid=event.pid, kind=event.kind,
                 section=event.section, timeout=event.timeout, elapsed=event.elapsed,
                 last_heartbeat_age=event.last_heartbeat_age, open_sections=list(event.open_sections) or None)
    ctx.inquiry.expired[event.local_rank] = event
    if ctx.inquiry.quiet(ctx.clock()):
        return None  # the peers of a culprit named a moment ago: their deadlines pass too
    opener = Opener(number=ctx.inquiry.number, group_rank=rnd.group_rank, rank=event.rank, kind=event.kind)
    with ctx.store_call("opening a hang inquiry"):
        opener = ctx.cluster.open_inquiry(rnd, opener)
    return _inquire(ctx, rnd, opener)


def on_opened(ctx: Context, rnd: Round, event: InquiryOpened) -> RoundResult | None:
    """Another node opened an inquiry: join it, unless this node joined already through its own expiry."""
    if event.opener.number != ctx.inquiry.number:
        return None
    return _inquire(ctx, rnd, event.opener)


def on_collective_timeout(ctx: Context, rnd: Round, failed: Sequence[Worker],
                          lines: Mapping[int, str]) -> tuple[bool, RoundResult | None]:
    """Local ranks died of a collective timeout (no heartbeat caught the hang first): each waited for another
    rank. (True, result) when the verdict names a culprit; (False, None) leaves them to the crash path."""
    waited = [RankEvidence(rank=w.rank, node=ctx.node, group_rank=rnd.group_rank, local_rank=w.local_rank,
                           pid=w.pid, state=ProcState.GONE, stack=StackClass.COLLECTIVE,
                           collective="a collective that timed out", where=lines[w.local_rank][:160],
                           expired=True, kind=TIMED_OUT) for w in failed]
    opener = Opener(number=ctx.inquiry.number, group_rank=rnd.group_rank, rank=failed[0].rank, kind=TIMED_OUT)
    ctx.inquiry.timed_out = {w.rank: lines[w.local_rank] for w in failed}
    with ctx.store_call("opening a hang inquiry"):
        opener = ctx.cluster.open_inquiry(rnd, opener)
    verdict, local = _verdict(ctx, rnd, opener, waited)
    if not verdict.determined:
        return False, None
    return True, _act(ctx, rnd, verdict, local, opener.group_rank == rnd.group_rank)


def _inquire(ctx: Context, rnd: Round, opener: Opener) -> RoundResult | None:
    verdict, local = _verdict(ctx, rnd, opener, ())
    return _act(ctx, rnd, verdict, local, opener.group_rank == rnd.group_rank)


def _verdict(ctx: Context, rnd: Round, opener: Opener,
             extra: Sequence[RankEvidence]) -> tuple[Verdict, list[RankEvidence]]:
    """Gather and publish this node's evidence; decide (the opener's node) or wait for the decision."""
    number, began, bound = opener.number, ctx.clock(), ctx.cfg.monitor.inquiry_timeout
    decider = opener.group_rank == rnd.group_rank
    ctx.inquiry.number += 1
    if ctx.watch is not None:
        ctx.watch.watch_inquiry(ctx.inquiry.number)
    gathered = [_with_expiry(e, ctx.inquiry.expired.get(e.local_rank)) for e in ctx.gather_evidence(rnd, bound)]
    known = {e.rank: e for e in extra}  # what this node knows better than /proc (why a rank exited) wins
    local = [known.pop(e.rank, e) for e in gathered] + list(known.values())
    with ctx.store_call("publishing hang evidence"):
        ctx.cluster.publish_evidence(rnd, number, local)
    if decider:
        with ctx.store_call("collecting hang evidence"):
            evidence, silent = ctx.cluster.collect_evidence(rnd, number, deadline=began + bound)
        verdict = _silence_noted(judge(evidence), silent)
        with ctx.store_call("publishing the hang verdict"):
            verdict = ctx.cluster.publish_verdict(rnd, number, verdict)
    else:
        with ctx.store_call("waiting for the hang verdict"):
            verdict = ctx.cluster.wait_verdict(rnd, number, deadline=began + bound + VERDICT_SLACK) \
                or _silence_noted(judge(local), [opener.group_rank])
    if verdict.basis is not Basis.WITHDRAWN:  # after a withdrawn one, the next expiry is judged afresh
        ctx.inquiry.quiet_until = ctx.clock() + ctx.cfg.monitor.hang_kill_grace + bound + VERDICT_SLACK
    _record(ctx, rnd, number, verdict, local, opener=opener, seconds=ctx.clock() - began)
    return verdict, local


def overdue(ctx: Context, rnd: Round) -> RoundResult | None:
    """The culprit's node had its time to stop the round and did not (its agent is stuck or gone without
    its peers noticing yet): restart the job from here, blaming no node."""
    if ctx.inquiry.elsewhere is None or ctx.clock() < ctx.inquiry.elsewhere_by:
        return None
    reason, ctx.inquiry.elsewhere = ctx.inquiry.elsewhere, None
    record = FailureRecord(round=rnd.index, rank=-1, local_rank=-1, node=ctx.node, group_rank=rnd.group_rank,
                           cause=Cause.HANG, status=None,
                           detail=f"the culprit's node did not stop the round after the verdict: {reason}")
    return handle_failure(ctx, rnd, [record], culprit_known=False)


def _with_expiry(evidence: RankEvidence, event: object) -> RankEvidence:
    """This node's expiry of the rank, in its evidence. ``watched`` (the monitor's phase is no longer
    "expired") says the client initialised again only for the NVRx client's deadlines: a step deadline of
    autobeat leaves the phase alone."""
    if not isinstance(event, RankExpired):
        return dataclasses.replace(evidence, watched=False)
    return dataclasses.replace(evidence, expired=True, kind=event.kind, section=event.section,
                               watched=evidence.watched and event.kind != STEP_KIND,
                               last_heartbeat_age=event.last_heartbeat_age
                               if event.last_heartbeat_age is not None else evidence.last_heartbeat_age)


def _silence_noted(verdict: Verdict, silent: Sequence[int]) -> Verdict:
    """Nodes that sent no evidence in time: a culprit named from the others' evidence stands (it was seen
    outside the collective they wait in); an undetermined verdict says whose evidence was missing."""
    if not silent or verdict.determined:
        return verdict
    nodes = ", ".join(str(g) for g in silent)
    return dataclasses.replace(verdict, reason=f"{verdict.reason}; no evidence from the node(s) of group rank {nodes}")


def _trigger(ctx: Context, opener: Opener) -> str:
    """What opened the inquiry, for people: the monitor's own words when the deadline passed on this node."""
    event = next((e for e in ctx.inquiry.expired.values() if isinstance(e, RankExpired) and e.rank == opener.rank),
                 None)
    if opener.rank in ctx.inquiry.timed_out:
        return f"rank {opener.rank} died of a collective timeout: {ctx.inquiry.timed_out[opener.rank]}"
    if event is not None:
        return f"rank {event.rank} {describe_expiry(event)}"
    return f"rank {opener.rank}'s {opener.kind} deadline passed" if opener.rank is not None else ""


def _record(ctx: Context, rnd: Round, number: int, verdict: Verdict, local: Sequence[RankEvidence], *,
            opener: Opener, seconds: float) -> None:
    where = {e.rank: e for e in verdict.evidence}
    ctx.log.emit("verdict", round=rnd.index, inquiry=number, culprits=list(verdict.culprits),
                 nodes=sorted({where[r].node for r in verdict.culprits if r in where}),
                 group_ranks=sorted({where[r].group_rank for r in verdict.culprits if r in where}),
                 basis=verdict.basis.value, reason=verdict.reason, waiting=list(verdict.waiting),
                 decider=opener.group_rank, seconds=round(seconds, 3), evidence=[evidence_to_dict(e) for e in local])
    stacks = [e.stacks_path for e in local if e.stacks_path]
    if stacks:
        ctx.log.emit("stacks", round=rnd.index, method=[ctx.cfg.monitor.stack_dump], paths=stacks)
    trigger = _trigger(ctx, opener)
    head = {Basis.WITHDRAWN: "", Basis.JOB_STALL: "HANG, job-wide: "}.get(
        verdict.basis, "HANG: " if verdict.determined else "HANG, culprit undetermined: ")
    ctx.say(head + verdict.reason + (f" (inquiry opened when {trigger})" if trigger else ""))


def _act(ctx: Context, rnd: Round, verdict: Verdict, local: Sequence[RankEvidence],
         decider: bool) -> RoundResult | None:
    """The culprit's node stops it and runs the failure path; an undetermined verdict restarts the job from the
    decider; a node without culprits waits for the culprit's node to act (its stop message)."""
    if verdict.basis is Basis.WITHDRAWN:
        return None  # the ranks restart in process: nothing hung, nothing to stop
    if ctx.telemetry:
        ctx.telemetry.detected()  # the verdict is the detection; the culprit's kill grace is restart time
    mine = {e.rank: e for e in local}
    culprits = [mine[r] for r in verdict.culprits if r in mine and ctx.group.by_local_rank(mine[r].local_rank)]
    if verdict.determined and not culprits:
        ctx.inquiry.elsewhere = verdict.reason  # local ranks that die now die of the culprit's stop
        cfg = ctx.cfg
        ctx.inquiry.elsewhere_by = (ctx.clock() + cfg.monitor.hang_kill_grace + cfg.workers.shutdown_timeout
                                    + cfg.rendezvous.peer_timeout)
        return None
    if not verdict.determined and not decider:
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
    expired = ctx.inquiry.expired.get(evidence.local_rank)
    detail = verdict.reason + (f" [its own deadline: {describe_expiry(expired)}]" if isinstance(expired, RankExpired)
                               else "")
    return FailureRecord(round=rnd.index, rank=evidence.rank, local_rank=evidence.local_rank, node=ctx.node,
                         group_rank=rnd.group_rank, cause=Cause.HANG, status=None,
                         pid=worker.pid if worker else evidence.pid, section=evidence.section, detail=detail,
                         stacks=evidence.stacks_path, stack_summary=evidence.where or None)


# What each kind of expired deadline (the ``kind`` of the monitor's ``expired`` event) means, for people.
EXPIRY_TEXT = {
    "initial_heartbeat": "sent no first heartbeat",
    "heartbeat": "sent no heartbeat",
    "section": "stayed in section '{section}'",
    "out_of_section": "stayed outside any section",
    "step": "finished no optimizer step",
}


def describe_expiry(event: RankExpired) -> str:
    """A rank monitor's expiry, described for people (the verdict, above, decides who hung)."""
    text = EXPIRY_TEXT.get(event.kind, event.kind).format(section=event.section)
    parts = [f"{text} for {event.elapsed:.2f} s (timeout {event.timeout:g} s)"
             if event.elapsed is not None and event.timeout is not None else text]
    if event.last_heartbeat_age is not None:
        parts.append(f"last heartbeat {event.last_heartbeat_age:.1f} s ago")
    if event.open_sections:
        parts.append(f"open sections: {', '.join(event.open_sections)}")
    return "; ".join(parts)
