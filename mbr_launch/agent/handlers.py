"""One small handler per kind of event; each returns how the round ends for this node, or None (go on)."""

from __future__ import annotations

from typing import Any, Callable, Optional

from mbr_launch.agent import inquiry
from mbr_launch.agent.context import Context
from mbr_launch.agent.failures import handle_failure
from mbr_launch.agent.messages import (AllDone, Departure, Event, InquiryOpened, MonitorDied, MonitorWarning,
                                       NodesWaiting, Outcome, PeerStopped, Progress, RankExpired, RankStarted,
                                       RoundResult, WorkloadRequest)
from mbr_launch.cluster.peers import PeerLost, PeersLeft, StoreLost
from mbr_launch.cluster.round import Round
from mbr_launch.cluster.stops import StopMessage
from mbr_launch.decide.causes import Cause
from mbr_launch.report import exitcodes
from mbr_launch.report.summary import FailureRecord


def dispatch(ctx: Context, rnd: Round, event: Event, local_done: bool) -> RoundResult | None:
    """Hand the event to its handler (``HANDLERS``); once this node's workers are done, only those of
    ``AFTER_LOCAL_DONE``."""
    if local_done and type(event) not in AFTER_LOCAL_DONE:
        return None
    handler = HANDLERS.get(type(event))
    return handler(ctx, rnd, event) if handler is not None else None


# Once this node's workers have all ended (``Context.finished_here``) it waits for the other nodes: only their news
# can end that wait. Every other event is about workers that are done, or re-forming a round that would restart them.
AFTER_LOCAL_DONE: frozenset[type] = frozenset({PeerStopped, PeerLost, StoreLost, AllDone, MonitorWarning})


# The signs of progress with events of their own; every other kind comes as first_progress, recorded here.
_STEP_OR_HEARTBEAT = ("step", "heartbeat")


def note_rank_started(ctx: Context, rnd: Round, event: RankStarted) -> None:
    """A rank is past start-up: a failure of this round is no longer a start-up failure."""
    ctx.current.heartbeats.add(event.local_rank)
    if len(ctx.current.heartbeats) >= len(ctx.group.workers):
        ctx.group.training()  # our own extra processes waited for the job's start (issue #38)
    for feature in ctx.features:
        feature.observe(ctx, event)  # telemetry records the first step
    if event.kind not in _STEP_OR_HEARTBEAT:
        ctx.log.emit("first_progress", round=rnd.index, rank=event.rank, local_rank=event.local_rank,
                     kind=event.kind, seconds=event.seconds)


def note_progress(ctx: Context, rnd: Round, event: Progress) -> None:
    for feature in ctx.features:
        feature.observe(ctx, event)


def note_peers_left(ctx: Context, rnd: Round, event: PeersLeft) -> None:
    """Nodes left the round: the node that left decided what follows (``agent.leaving``); only recorded here."""
    ctx.log.emit("peer_left", round=rnd.index, group_ranks=list(event.group_ranks))
    ctx.say(f"group rank(s) {list(event.group_ranks)} left the job (stopped by a signal that did not reach every "
            "node)")


def handle_peer_stop(ctx: Context, rnd: Round, event: PeerStopped) -> RoundResult:
    message = event.message
    ctx.log.emit("stop", round=rnd.index, reason=message.reason, origin=message.origin)
    if message.group_rank != rnd.group_rank:
        ctx.say(f"stopping local workers: {message.reason} (from {message.origin})")
    return _stop_here(ctx, rnd, message)


def handle_nodes_waiting(ctx: Context, rnd: Round, event: NodesWaiting) -> RoundResult:
    """Nodes wait to join: stop this round everywhere so the next one admits them (no budget spent)."""
    message = StopMessage(reason=f"{event.count} node(s) waiting to join", origin=ctx.node,
                          restart_count=rnd.restart_count, membership=True)
    with ctx.store_call("announcing a membership change"):
        ctx.cluster.publish(rnd, message)
        decided = ctx.cluster.read(rnd) or message
    return _stop_here(ctx, rnd, decided)


def _stop_here(ctx: Context, rnd: Round, message: StopMessage) -> RoundResult:
    """This node's workers stop for the round's stop message; the attempt ends then (goodput's restart time
    begins)."""
    ctx.group.stop(rnd, grace=ctx.cfg.workers.shutdown_timeout)
    for feature in ctx.features:
        feature.attempt_ended(ctx, "stop")
    return RoundResult(Outcome.FINAL if message.final else Outcome.RESTART, message=message)


def handle_silence(ctx: Context, rnd: Round, event: PeerLost | StoreLost) -> RoundResult | None:
    if isinstance(event, StoreLost):
        ctx.log.emit("peer_lost", round=rnd.index, kind="store_lost", detail=event.detail)
        ctx.departure = Departure.NONE  # nothing to tell a store we cannot reach
        ctx.say(f"LOST THE RENDEZVOUS STORE: {event.detail}; stopping local workers")
        ctx.group.stop(rnd, grace=ctx.cfg.workers.shutdown_timeout)
        return RoundResult(Outcome.FINAL, message=StopMessage(reason=f"lost the rendezvous store: {event.detail}",
                                                              exit_code=exitcodes.RENDEZVOUS, final=True))
    ctx.log.emit("peer_lost", round=rnd.index, kind="peer_lost", detail=event.describe())
    record = FailureRecord(round=rnd.index, rank=-1, local_rank=-1, node=f"group rank {event.group_rank}",
                           group_rank=event.group_rank, cause=Cause.PEER, status=None, detail=event.describe())
    return handle_failure(ctx, rnd, [record], nodes_lost=1)


def handle_monitor_died(ctx: Context, rnd: Round, event: MonitorDied) -> RoundResult | None:
    ctx.log.emit("monitor_lost", round=rnd.index, exit_code=event.exit_code)
    record = FailureRecord(round=rnd.index, rank=-1, local_rank=-1, node=ctx.node, group_rank=rnd.group_rank,
                           cause=Cause.MONITOR, status=None,
                           detail=f"the rank monitor process died (exit {event.exit_code}); hang detection was "
                                  "lost, so the round is restarted")
    ctx.monitor.restart()
    return handle_failure(ctx, rnd, [record])


# A hostile client can make the monitor refuse a lot: neither the console nor events.jsonl may fill up.
CONSOLE_WARNINGS = 5
LOGGED_WARNINGS = 200


def note_monitor_warning(ctx: Context, rnd: Round, event: MonitorWarning) -> None:
    ctx.monitor_warnings += 1
    count = ctx.monitor_warnings
    if count <= LOGGED_WARNINGS:
        last = {"suppressed_after": LOGGED_WARNINGS} if count == LOGGED_WARNINGS else {}
        ctx.log.emit("monitor_warning", round=rnd.index, local_rank=event.local_rank, pid=event.pid,
                     message=event.message, **last)
    if count <= CONSOLE_WARNINGS:
        more = "; further rank monitor warnings go to events.jsonl only" if count == CONSOLE_WARNINGS else ""
        ctx.say(f"WARNING: rank monitor: {event.message}{more}")


def handle_workload_request(ctx: Context, rnd: Round, event: WorkloadRequest) -> RoundResult | None:
    ctx.log.emit("workload_request", rank=event.rank, action=event.action, description=event.description)
    if event.action not in ("ShutdownWorkload", "ExcludeThisNode"):
        return None
    record = FailureRecord(round=rnd.index, rank=-1 if event.rank is None else event.rank, local_rank=-1,
                           node=ctx.node, group_rank=rnd.group_rank, cause=Cause.REQUEST, status=None,
                           detail=f"rank {event.rank} requested {event.action}: {event.description}")
    return handle_failure(ctx, rnd, [record], shutdown=event.action == "ShutdownWorkload",
                          exclude=event.action == "ExcludeThisNode")


# ---- the table ---------------------------------------------------------------------------------------

Handler = Callable[[Context, Round, Any], Optional[RoundResult]]

# tests/test_dispatch.py: every kind of ``messages.Event`` has its handler.
HANDLERS: dict[type, Handler] = {
    PeerStopped: handle_peer_stop,
    PeerLost: handle_silence,
    PeersLeft: note_peers_left,
    StoreLost: handle_silence,
    AllDone: lambda ctx, rnd, event: RoundResult(Outcome.SUCCEEDED),
    MonitorWarning: note_monitor_warning,
    NodesWaiting: handle_nodes_waiting,
    RankStarted: note_rank_started,
    Progress: note_progress,
    RankExpired: inquiry.on_expiry,
    InquiryOpened: inquiry.on_opened,
    MonitorDied: handle_monitor_died,
    WorkloadRequest: handle_workload_request,
}
