"""Workers that exited with an error: a crash to record and restart, or, when the worker died of a
collective timeout, a rank that waited for a hung one (the hang inquiry names that one instead)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from mbr_launch.agent import inquiry
from mbr_launch.agent.context import Context
from mbr_launch.agent.failures import handle_failure
from mbr_launch.agent.messages import RoundResult
from mbr_launch.cluster.round import Round
from mbr_launch.decide.causes import Cause
from mbr_launch.decide.timeouts import collective_timeout, peer_gone
from mbr_launch.report.summary import ErrorFile, FailureRecord
from mbr_launch.workers.process import Worker

# Seconds a rank that died of a lost peer waits for that peer's own exit on this node, when a local rank is
# still alive to be that peer (a peer on another node tells its own agent, whose stop message comes).
CASCADE_WAIT = 0.5


def handle_crashes(ctx: Context, rnd: Round, failed: Sequence[Worker]) -> RoundResult | None:
    if ctx.current.inquiry.elsewhere and ctx.current.inquiry.quiet(ctx.clock()):
        # A verdict named a culprit on another node a moment ago: that node is stopping it, and these ranks
        # lost their peer in the collective. Consequences, not failures: the culprit's node ends the round.
        for worker in failed:
            ctx.say(f"rank {worker.rank} exited ({worker.status.describe() if worker.status else '?'}) after the "
                    f"verdict: {ctx.current.inquiry.elsewhere}; waiting for that node to stop the round")
        return None
    lines = {w.local_rank: ctx.group.last_lines(w) for w in failed}
    alive = any(w.alive for w in ctx.group.workers)
    if alive and all(peer_gone(lines[w.local_rank]) for w in failed):
        cause = _await_cause(ctx, rnd)
        if cause:  # record the cause; the ranks that lost it are in the log as worker exits
            failed = cause
            lines = {w.local_rank: ctx.group.last_lines(w) for w in failed}
    sections = ctx.monitor.last_sections([w.local_rank for w in failed])  # one monitor round trip for all
    records = [crash_record(ctx, rnd, w, sections.get(w.local_rank)) for w in failed]
    timed_out = {w.local_rank: line for w in failed
                 if (line := collective_timeout(lines[w.local_rank], w.status.signal if w.status else None))}
    if len(timed_out) == len(failed):  # every one of them waited for someone: find whom before blaming
        decided, result = inquiry.on_collective_timeout(ctx, rnd, failed, timed_out)
        if decided:
            return result
    return handle_failure(ctx, rnd, records)


def _await_cause(ctx: Context, rnd: Round) -> list[Worker]:
    """The ranks that failed so far only lost their peer: the peer is exiting too (a crash on its way out, a
    script's own exit code), and its exit is the failure to act on. Wait briefly for it."""
    deadline = ctx.clock() + CASCADE_WAIT
    while (left := deadline - ctx.clock()) > 0:
        ctx.wakeup.wait(ctx.group.pidfds(), left)
        more = [w for w in ctx.group.reap(rnd) if w.status is not None and not w.status.ok]
        if more:
            return more
    return []


def crash_record(ctx: Context, rnd: Round, worker: Worker, section: str | None) -> FailureRecord:
    """``section``: the rank's open sections when it died, as the monitor said (``Monitor.last_sections``)."""
    assert worker.status is not None
    error_file = ErrorFile.read(Path(worker.spec.env["TORCHELASTIC_ERROR_FILE"]))
    return FailureRecord(round=rnd.index, rank=worker.rank, local_rank=worker.local_rank, node=ctx.node,
                         group_rank=rnd.group_rank, cause=Cause.CRASH, status=worker.status, pid=worker.pid,
                         section=section, error_file=error_file)
