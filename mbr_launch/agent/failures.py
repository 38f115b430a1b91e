"""A failure, from facts to action: record it, gather the facts the policy needs (job-wide counts from the
store), ask the pure policy, act on its decision (restart here, restart the job, leave, or end)."""

from __future__ import annotations

from mbr_launch.agent.context import Context
from mbr_launch.agent.messages import Outcome, RoundResult
from mbr_launch.agent.progress import back_off
from mbr_launch.cluster.round import Round
from mbr_launch.cluster.stops import StopMessage
from mbr_launch.decide.causes import Cause
from mbr_launch.decide.policy import Action, Decision, FailureFacts, Kept, Scope, decide, quick_failure, tolerated
from mbr_launch.report import exitcodes
from mbr_launch.report.summary import FailureRecord


def handle_failure(ctx: Context, rnd: Round, records: list[FailureRecord], *, shutdown: bool = False,
                   exclude: bool = False, nodes_lost: int = 0, culprit_known: bool = True) -> RoundResult | None:
    """Record failures, ask the policy, act; None when the round goes on. ``culprit_known`` False: an
    undetermined hang, no node blamed."""
    for record in records:
        ctx.summary.failures.append(record)
        ctx.log.emit("failure", **record.to_event(), startup=not ctx.current.heartbeats)
        ctx.say(f"FAILURE: {record.describe()}")
    facts = _facts(ctx, rnd, records[0].cause, records[0], shutdown=shutdown, exclude=exclude, nodes_lost=nodes_lost,
                   culprit_known=culprit_known)
    decision = decide(ctx.cfg.policy, facts)
    if decision.action is Action.CONTINUE:
        _leave_lost(ctx, rnd, records, decision, facts)
        return None
    for feature in ctx.features:
        feature.attempt_ended(ctx, "failure", records[0].cause.value)
    if decision.kept is Kept.STORE:
        ctx.say(f"{Kept.STORE.value} ({rnd.store_host}:{rnd.store_port}), so it stays: {decision.reason}")
    elif decision.kept is Kept.LAST_NODES:
        ctx.say(f"{Kept.LAST_NODES.value}, so this node stays: {decision.reason}")
    ctx.quick_failures = ctx.quick_failures + 1 if quick_failure(ctx.cfg.policy, facts) else 0
    if decision.action is Action.RESTART and decision.scope is not Scope.JOB:
        return _restart_here(ctx, rnd, records, decision)
    if decision.action is Action.EXCLUDE_NODE:
        return _leave(ctx, rnd, decision)
    if decision.action is Action.RESTART or decision.exhausted:
        for feature in ctx.features:  # ft_launcher's progress tracking: not worth another cycle?
            if (stop := feature.on_failure(ctx, rnd)) is not None:
                stuck, code = stop
                return _stop_round(ctx, rnd, Decision(Action.STOP, Scope.JOB, stuck), stuck, exit_code=code)
    plain = decision.action is Action.RESTART and facts.healthy_nodes is None
    reason = records[0].describe() if plain else f"{records[0].describe()}; {decision.reason}"
    nv = ctx.cfg.nvrx
    if decision.unfixable and nv.attribution_stop_action == "no-restart":
        # ft_launcher 0.7's attribution STOP: the no-restart code tells a requeue script not to requeue.
        reason += f"; not to be requeued (--ft-attribution-stop-action no-restart: exit {nv.no_restart_exit_code})"
        return _stop_round(ctx, rnd, decision, reason, exit_code=nv.no_restart_exit_code)
    return _stop_round(ctx, rnd, decision, reason)


def _facts(ctx: Context, rnd: Round, cause: Cause, first: FailureRecord, *, shutdown: bool, exclude: bool,
           nodes_lost: int, culprit_known: bool) -> FailureFacts:
    with ctx.store_call("recording a failure in the rendezvous store"):
        restarts, startup_restarts = ctx.rendezvous.counts(rnd)
        healthy = _healthy_nodes(ctx, rnd) if ctx.cfg.policy.min_healthy and cause is Cause.CRASH else None
        lost = tolerated(ctx.cfg.policy, FailureFacts(cause=cause, healthy_nodes=healthy))
        blamed = cause.node_fault and culprit_known and not lost  # a lost rank is no node failure: nothing restarts
        node_failures = ctx.rendezvous.count_node_failure(rnd, ctx.node) if blamed else 0
        # Read only where the policy weighs it (torch's whole rendezvous state).
        waiting = ctx.rendezvous.spare_count() if _spares_matter(ctx, cause, exclude, node_failures) else 0
    return FailureFacts(
        cause=cause, exit_code=first.status.code if first.status else None, startup=not ctx.current.heartbeats,
        round_seconds=ctx.clock() - ctx.current.started, restarts_used=restarts,
        startup_restarts_used=startup_restarts, node_failures=node_failures, quick_failures=ctx.quick_failures,
        exclude_requested=exclude, shutdown_requested=shutdown,
        nodes_left=rnd.group_world_size - 1 - nodes_lost + waiting,
        nodes_remaining=rnd.group_world_size - nodes_lost + waiting, culprit_known=culprit_known,
        hosts_store=(exclude or ctx.cfg.policy.max_node_failures > 0) and ctx.cluster.hosts_store(rnd),
        healthy_nodes=healthy)


def _spares_matter(ctx: Context, cause: Cause, exclude: bool, node_failures: int) -> bool:
    """Whether the nodes waiting outside the round can change ``decide``'s answer (a leaving node, a lost peer)."""
    limit = ctx.cfg.policy.max_node_failures
    return exclude or cause is Cause.PEER or bool(limit and node_failures >= limit)


def _healthy_nodes(ctx: Context, rnd: Round) -> int:
    """min-healthy: the round's nodes with every rank alive; this node's first lost rank counts it out."""
    return rnd.group_world_size - ctx.cluster.count_unhealthy(rnd, add=not ctx.current.lost)


def _leave_lost(ctx: Context, rnd: Round, records: list[FailureRecord], decision: Decision,
                facts: FailureFacts) -> None:
    ranks = [r.rank for r in records]
    ctx.current.lost |= {r.local_rank for r in records}
    ctx.log.emit("rank_lost", round=rnd.index, ranks=ranks, local_ranks=[r.local_rank for r in records],
                 healthy_nodes=facts.healthy_nodes, nodes=rnd.group_world_size, min_nodes=ctx.cfg.policy.min_nodes,
                 alive=[w.rank for w in ctx.group.workers if w.alive])
    ctx.say(f"rank(s) {ranks} lost, not restarted (--restart-policy min-healthy): {decision.reason}")


def _restart_here(ctx: Context, rnd: Round, records: list[FailureRecord], decision: Decision) -> RoundResult | None:
    """--restart-scope node|rank: only this node's (or the failed ranks') processes restart."""
    cfg = ctx.cfg
    with ctx.store_call("counting a restart"):
        total = ctx.rendezvous.count_restart(rnd, startup=decision.counts_as_startup, once_per_round=False)
    ranks = sorted({r.local_rank for r in records}) if decision.scope is Scope.RANK else None
    ctx.group.stop(rnd, local_ranks=ranks, grace=cfg.workers.shutdown_timeout)
    ctx.log.emit("restart", round=rnd.index, restart_count=total, max_restarts=cfg.policy.max_restarts,
                 scope=decision.scope, backoff=decision.backoff)
    which = "this node" if ranks is None else "rank(s) " + str([rnd.rank_offset + r for r in ranks])
    ctx.say(f"restarting {which} only (--restart-scope {decision.scope}; restart {total} of {cfg.policy.max_restarts})")
    if not back_off(ctx, decision.backoff):
        return None  # a signal came during the back-off: the loop handles it next
    ctx.current.heartbeats = set() if ranks is None else ctx.current.heartbeats - set(ranks)
    ctx.group.start(rnd, ranks, restart_count=total)
    for feature in ctx.features:
        feature.workers_started(ctx, rnd, ranks if ranks is not None else [w.local_rank for w in ctx.group.workers])
    return None


def _leave(ctx: Context, rnd: Round, decision: Decision) -> RoundResult:
    message = StopMessage(reason=f"node {ctx.node} leaves the job: {decision.reason}", origin=ctx.node,
                          group_rank=rnd.group_rank, exclude=ctx.node, restart_count=rnd.restart_count)
    ctx.log.emit("exclude", round=rnd.index, reason=decision.reason)
    with ctx.store_call("announcing the exclusion"):
        ctx.cluster.publish(rnd, message)
    ctx.group.stop(rnd, grace=ctx.cfg.workers.shutdown_timeout)
    return RoundResult(Outcome.EXCLUDED, message=message)


def _stop_round(ctx: Context, rnd: Round, decision: Decision, reason: str,
                exit_code: int = exitcodes.FAILED) -> RoundResult:
    """Restart the job or end it (with ``exit_code``): the round's first stop message wins."""
    final = decision.action is Action.STOP
    with ctx.store_call("announcing the failure to the other nodes"):
        count = rnd.restart_count if final else ctx.rendezvous.count_restart(
            rnd, startup=decision.counts_as_startup, once_per_round=True)
        message = StopMessage(reason=reason, origin=ctx.node, group_rank=rnd.group_rank, final=final,
                              exit_code=exit_code, restart_count=count, backoff=decision.backoff)
        ctx.cluster.publish(rnd, message)
        decided = ctx.cluster.read(rnd) or message  # when two nodes fail at once, the first message wins
    ctx.group.stop(rnd, grace=ctx.cfg.workers.shutdown_timeout)
    return RoundResult(Outcome.FINAL if decided.final else Outcome.RESTART, message=decided)
