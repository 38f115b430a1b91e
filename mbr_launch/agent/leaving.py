"""A stop signal in a job of several nodes: whether it stops the job or only this node, and this node's
departure when it stops only this node (the rules: ``decide.leaving``; cases and exit codes: docs/slurm.md).

The signal is recorded in the round's store at once and the workers get it with their grace; then the
signal's reach decides: the job stops (exit 5 or 128+N), or this node leaves the rendezvous, tells the others
what the policy makes of it, and exits 6. The store's host cannot leave without the store: its signal ends
the job (exit 3 everywhere). Outside a round (``stop_outside_round``) there are no workers to stop.
"""

from __future__ import annotations

import contextlib
import signal

from mbr_launch.agent.context import Context
from mbr_launch.agent.ending import finish, finish_signaled
from mbr_launch.agent.messages import Departure, Outcome, RoundResult
from mbr_launch.cluster.departures import JOB_STOP_KEY, job_stopped
from mbr_launch.cluster.round import Round
from mbr_launch.cluster.stops import StopMessage
from mbr_launch.decide.leaving import AfterDeparture, DepartureFacts, Next, Reach, after_departure, reach, window
from mbr_launch.report import exitcodes

POLL = 0.25  # seconds between counts of the round's signalled nodes, while the answer is not known


def note_signal(ctx: Context, signum: int, *, workers: bool = True,
                phase: str = "while waiting in the rendezvous") -> tuple[signal.Signals, float]:
    """Log and say a signal (or preemption); the signal the workers get, and their grace. ``workers`` False:
    none run (the signal came in ``phase``)."""
    cfg = ctx.cfg
    name = signal.Signals(signum).name
    ctx.log.emit("signal", signal=name)
    if name in cfg.preemption.signals:
        forward, grace = signal.Signals[cfg.preemption.forward_signal], cfg.preemption.grace
        ctx.log.emit("preemption", signal=name, forward=forward.name, grace=grace)
        ctx.say(f"PREEMPTION ({name}): " + (f"sending {forward.name} to the workers so they can checkpoint, then "
                                            f"stopping them after {grace:g} s" if workers else
                                            f"{phase}; no workers to stop"))
    else:
        forward, grace = signal.Signals(signum), cfg.workers.shutdown_timeout
        ctx.say(f"received {name}: " + (f"forwarding it to the workers, then stopping them (grace {grace:g} s)"
                                        if workers else f"{phase}; stopping"))
    return forward, grace


def stop_for_signal(ctx: Context, rnd: Round, signum: int, *, workers: bool = True) -> RoundResult:
    """Stop this node's workers, then stop the job (``SIGNALED``) or leave it (``LEFT``; the store's host:
    ``FINAL``)."""
    name = signal.Signals(signum).name
    began = ctx.clock()
    forward, grace = note_signal(ctx, signum, workers=workers, phase="before the workers started")
    count = _record(ctx, rnd, name)
    ctx.group.stop(rnd, first_signal=forward, grace=grace)
    how = _settle(ctx, rnd, signum, count, began)
    if how is Reach.JOB:
        _try_publish(ctx, rnd, StopMessage(reason=f"{name} on node {ctx.node}", origin=ctx.node, final=True))
        return RoundResult(Outcome.SIGNALED, signum=signum)
    return _depart(ctx, rnd, name, signum)


def stop_outside_round(ctx: Context, signum: int, *, phase: str = "while waiting in the rendezvous") -> int:
    """A stop signal while this node is in no round (``ctx.round``: its last); the exit code."""
    name = signal.Signals(signum).name
    note_signal(ctx, signum, workers=False, phase=phase)
    ctx.departure = Departure.LEAVE  # this node goes; the rendezvous stays open for the nodes that stay
    last, began = ctx.round, ctx.clock()
    if last is not None and last.group_world_size > 1:  # between rounds: counted in the round it was in
        if _settle(ctx, last, signum, _record(ctx, last, name), began) is Reach.JOB:
            return finish_signaled(ctx, signum, last)
        return finish(ctx, exitcodes.EXCLUDED, _announce(ctx, last, name, "between two rounds", AfterDeparture(
            Next.GO_ON, "the other nodes re-form the round without it")))
    if last is None and _spare(ctx):  # a round of the job runs without this node
        if _job_stopped(ctx, signum, began):
            return finish_signaled(ctx, signum, None)
        return finish(ctx, exitcodes.EXCLUDED, _announce(ctx, None, name, "while it waited as a spare",
                                                         AfterDeparture(Next.GO_ON, "the round goes on")))
    return finish_signaled(ctx, signum, None)  # the job had not started (or has one node): the signal stops it


def conclude(ctx: Context, rnd: Round, result: RoundResult) -> int:
    if result.outcome is Outcome.SIGNALED:
        assert result.signum is not None
        return finish_signaled(ctx, result.signum, rnd)
    assert result.message is not None
    if result.outcome is Outcome.LEFT:
        return finish(ctx, exitcodes.EXCLUDED, result.message.reason)
    return finish(ctx, result.message.exit_code, result.message.reason)


# ---- how far it reached ----------------------------------------------------------------------------------


def _record(ctx: Context, rnd: Round, name: str) -> int | None:
    """Count this node in the round's signalled nodes; the count, None when the store did not answer."""
    if rnd.group_world_size <= 1:
        return 1
    try:
        with ctx.store_call("recording the signal in the rendezvous store"):
            return ctx.cluster.record_signal(rnd, name)
    except Exception:  # noqa: BLE001 - the store is gone: no node can go on without it, the job stops
        return None


def _settle(ctx: Context, rnd: Round, signum: int, count: int | None, began: float) -> Reach:
    """Count the round's signalled nodes until the reach is known. A second signal ends the wait (this node
    goes now); a store that no longer answers stops the job."""
    limit = window(ctx.cfg.rendezvous.peer_timeout)
    while True:
        step_wide = _step_wide(ctx, signum)
        if count is None:
            how, by = Reach.JOB, "step" if step_wide else "store"
            break
        how = reach(nodes=rnd.group_world_size, signalled=count, waited=ctx.clock() - began, window=limit,
                    step_wide=step_wide)
        if how is not None:
            by = "step" if step_wide else "count" if how is Reach.JOB else "window"
            break
        if not ctx.wakeup.sleep(min(POLL, max(0.0, began + limit - ctx.clock()))):
            step_wide = _step_wide(ctx, signum)  # a second signal: this node goes now, as the job's where it is
            how, by = (Reach.JOB, "step") if step_wide else (Reach.NODE, "second signal")
            break
        try:
            with ctx.store_call("counting the nodes a signal reached"):
                count = ctx.cluster.count_signalled(rnd)
        except Exception:  # noqa: BLE001
            count = None
    ctx.log.emit("signal_reach", round=rnd.index, reach=how.value, by=by, signalled=count,
                 nodes=rnd.group_world_size)
    return how


def _step_wide(ctx: Context, signum: int) -> bool:
    """Slurm sent ``signum`` to this node's whole step: the rank monitor has it pending too (``monitor.witness``)."""
    slurm = ctx.cfg.slurm
    if slurm is None or not slurm.in_step:
        return False
    pending = ctx.monitor.pending_signals()
    return pending is not None and signum in pending


def _spare(ctx: Context) -> bool:
    """Whether a round of this job is running (complete) while this node waits outside it."""
    try:
        state = ctx.rendezvous.state()
    except Exception:  # noqa: BLE001 - unknown: as if the job had not started
        return False
    return state is not None and state.complete


def _job_stopped(ctx: Context, signum: int, began: float) -> bool:
    """A spare's signal: whether the round's nodes got it too (the step's, or the job's mark in the window)."""
    limit = window(ctx.cfg.rendezvous.peer_timeout)
    while True:
        if _step_wide(ctx, signum) or job_stopped(ctx.rendezvous.job_get(JOB_STOP_KEY)) is not None:
            return True
        if ctx.clock() - began >= limit or not ctx.wakeup.sleep(POLL):
            return False


# ---- leaving ---------------------------------------------------------------------------------------------


def _depart(ctx: Context, rnd: Round, name: str, signum: int) -> RoundResult:
    """The signal reached this node alone: leave the round, and tell the others what that makes of it."""
    if ctx.cluster.hosts_store(rnd):
        reason = (f"{name} stopped node {ctx.node}, which serves the rendezvous store, and not the other nodes: "
                  "the job cannot go on without its store (serve it apart with `mbr-launch store` so that a "
                  "training node can leave)")
        message = StopMessage(reason=reason, origin=ctx.node, group_rank=rnd.group_rank, final=True,
                              exit_code=exitcodes.RENDEZVOUS)
        _try_publish(ctx, rnd, message)
        return RoundResult(Outcome.FINAL, message=message)
    policy = ctx.cfg.policy
    with ctx.store_call("reading the job's counts before leaving"):
        waiting = 0 if policy.min_healthy else ctx.rendezvous.spare_count()
        restarts, _startup = ctx.rendezvous.counts(rnd)
    _leave_rendezvous(ctx)
    ctx.departure = Departure.NONE  # left already (or its keep-alive expires): nothing more at the exit
    with ctx.store_call("leaving the round"):
        gone = ctx.cluster.mark_left(rnd)
        ctx.cluster.mark_done(rnd)  # the round's end no longer waits for this node's workers
        unhealthy = ctx.cluster.count_unhealthy(rnd, add=not ctx.current.lost) if policy.min_healthy else 0
    after = after_departure(policy, DepartureFacts(
        nodes=rnd.group_world_size, left=len(gone), unhealthy=unhealthy, waiting=waiting, restarts_used=restarts,
        elastic=ctx.cfg.rendezvous.backend == "c10d" and not ctx.cfg.rendezvous.standalone))
    _tell_the_others(ctx, rnd, name, after)
    reason = _announce(ctx, rnd, name, "and not the whole job", after)
    return RoundResult(Outcome.LEFT, signum=signum, message=StopMessage(
        reason=reason, origin=ctx.node, group_rank=rnd.group_rank, exclude=ctx.node))


def _leave_rendezvous(ctx: Context) -> str | None:
    """Leave torch's rendezvous before the others re-form; why it could not (a static one has no membership)."""
    if ctx.cfg.rendezvous.backend != "c10d":
        return None
    with ctx.guard.around(ctx.cfg.rendezvous.peer_timeout * 2 + 15, "leaving the rendezvous"):
        return leave_failed(ctx, ctx.rendezvous.leave())


def leave_failed(ctx: Context, why: str | None) -> str | None:
    if why is not None:
        ctx.log.emit("leave_failed", round=ctx.round.index if ctx.round else None, reason=why)
        ctx.say(f"WARNING: could not leave the rendezvous: {why}; the other nodes drop this node once its "
                "keep-alive expires")
    return why


def _tell_the_others(ctx: Context, rnd: Round, name: str, after: AfterDeparture) -> None:
    reason = f"node {ctx.node} (group rank {rnd.group_rank}) left the job ({name} reached it alone): {after.reason}"
    if after.next is Next.REFORM:
        message = StopMessage(reason=reason, origin=ctx.node, restart_count=rnd.restart_count, membership=True)
    elif after.next is Next.RESTART:
        with ctx.store_call("counting a restart"):
            count = ctx.rendezvous.count_restart(rnd, startup=False, once_per_round=True)
        message = StopMessage(reason=reason, origin=ctx.node, restart_count=count)
    elif after.next is Next.STOP:
        message = StopMessage(reason=reason, origin=ctx.node, final=True, exit_code=exitcodes.FAILED)
    else:
        return
    _try_publish(ctx, rnd, message)


def _announce(ctx: Context, rnd: Round | None, name: str, where: str, after: AfterDeparture) -> str:
    """Log and say that this node leaves the job; the run's reason."""
    ctx.log.emit("node_left", round=rnd.index if rnd else None, signal=name, next=after.next.value,
                 reason=after.reason)
    ctx.say(f"{name} reached this node {where}: it leaves the job ({after.reason})")
    return f"{name} reached this node {where}: it left the job; {after.reason}"


def _try_publish(ctx: Context, rnd: Round, message: StopMessage) -> None:
    # The store may be gone too; this node's own exit does not depend on it.
    with contextlib.suppress(Exception), ctx.store_call("telling the other nodes"):
        ctx.cluster.publish(rnd, message)
