"""The supervisor loop: rounds until the job ends for this node.

Round states::

    JOINING --> RUNNING --> SUCCEEDED --> (all nodes done) --> exit 0
                   |  \\--> FAILED (crash / hang / lost monitor / lost peer) --> policy:
                   |          restart job       --> stop message to all nodes --> JOINING
                   |          restart node/rank --> respawn locally --> RUNNING
                   |          exclude node      --> leave the rendezvous --> exit 6 (the others go on)
                   |          stop              --> final stop message --> exit 1
                   \\--> STOPPED (a peer's message, membership change) --> JOINING (or exit if final)
                   \\--> SIGNAL --> every node of the round got one: the job stops --> exit 5 / 128+N
                               only this node (or some): it leaves, the others go on --> exit 6 (agent.leaving)

Inside a round the loop has fixed steps: wait (one ``select`` over the wake-up pipe and the pidfds) -> signals
-> reap exited workers -> dispatch events -> postponed expiries -> tick the features -> done here? -> store
silence. Every collaborator comes in through the ``Context``, so tests replay scripted histories through it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from mbr_launch.agent import inquiry, leaving
from mbr_launch.agent.context import Context, RoundState
from mbr_launch.agent.ending import final_code, finish
from mbr_launch.agent.failures import handle_failure
from mbr_launch.agent.handlers import dispatch, handle_silence
from mbr_launch.agent.messages import Departure, MonitorDied, Outcome, RoundResult
from mbr_launch.agent.progress import back_off, bounded_backoff, join_progress, timed_out
from mbr_launch.agent.wakeup import Interrupted
from mbr_launch.cluster.peers import StoreLost
from mbr_launch.cluster.storeguard import StoreUnreachable
from mbr_launch.cluster.rendezvous import RendezvousClosed, RendezvousFailed
from mbr_launch.cluster.round import Round
from mbr_launch.decide.causes import Cause, collective_timeout, peer_gone
from mbr_launch.report import exitcodes
from mbr_launch.report.summary import ErrorFile, FailureRecord
from mbr_launch.workers.process import Worker


class Supervisor:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._tick = min(0.5, ctx.cfg.rendezvous.peer_timeout / 4)  # bounds how late silence and telemetry are seen
        self._after: tuple[Round, str | None] | None = None  # the round a job-wide restart ended, and why no fast path

    def run(self) -> int:
        """Join a round, run it, act on how it ended; the exit code when the job ends for this node."""
        while True:
            rnd = self._join()
            if isinstance(rnd, int):
                return rnd
            try:
                code = self._conclude(rnd, self._run_round(rnd))
            except StoreUnreachable as lost:
                code = self._store_gone(rnd, lost)
            if code is not None:
                return code

    def _store_gone(self, rnd: Round, lost: StoreUnreachable) -> int:
        """The store is gone (its host's agent died): every survivor ends with exit 3 and what to do."""
        ctx = self.ctx
        result = handle_silence(ctx, rnd, StoreLost(
            f"the rendezvous store at {rnd.store_host}:{rnd.store_port} is gone ({lost.what} failed: "
            f"{type(lost.error).__name__}: {lost.error}); the node that hosted it was lost, so this job cannot go "
            "on: start it again (under Slurm: requeue it); to keep a training node's loss from taking the "
            "store, run the store apart with `mbr-launch store`"))
        assert result.message is not None
        return finish(ctx, result.message.exit_code, result.message.reason)

    def _watch(self, rnd: Round) -> RoundResult:
        """wait -> reap -> dispatch -> tick -> decide, until this round ends for this node."""
        local_done = False
        while True:
            self._wait()
            result = self._signal(rnd) or self._reap(rnd, local_done) or self._dispatch(rnd, local_done)
            if result is None and not local_done:
                result = inquiry.resume_postponed(self.ctx, rnd) or self._tick_features(rnd)
                if result is None and self.ctx.finished_here():
                    local_done = True
                    result = self._done_here(rnd)
            if result is not None or (result := self._silence(rnd)) is not None:
                return result

    # ---- the steps ------------------------------------------------------------------------------

    def _wait(self) -> None:
        ctx = self.ctx
        monitor_fd = ctx.monitor.pidfd
        fds = ctx.group.pidfds() + ([monitor_fd] if monitor_fd is not None else [])
        ready = ctx.wakeup.wait(fds, self._tick)
        if monitor_fd is not None and monitor_fd in ready:
            ctx.wakeup.post(MonitorDied(ctx.monitor.reap()))

    def _reap(self, rnd: Round, local_done: bool) -> RoundResult | None:
        failed = [w for w in self.ctx.group.reap(rnd) if w.status is not None and not w.status.ok]
        if not failed or local_done:
            return None
        return handle_crashes(self.ctx, rnd, failed)

    def _signal(self, rnd: Round) -> RoundResult | None:
        """Before the reaping: the ranks a stop signal killed too (Slurm signals the step) are no crash."""
        signum = self.ctx.wakeup.take_signal()
        return None if signum is None else leaving.stop_for_signal(self.ctx, rnd, signum)

    def _dispatch(self, rnd: Round, local_done: bool) -> RoundResult | None:
        for event in self.ctx.wakeup.take_events():
            result = dispatch(self.ctx, rnd, event, local_done)
            if result is not None:
                return result  # the rest belonged to this round; the next one starts without them
        return None

    def _tick_features(self, rnd: Round) -> RoundResult | None:
        for feature in self.ctx.features:
            if (result := feature.tick(self.ctx, rnd)) is not None:
                return result
        return None

    def _done_here(self, rnd: Round) -> RoundResult | None:
        """This node's workers all succeeded: the round ends when every node's have."""
        ctx = self.ctx
        with ctx.store_call("reporting this node done"):
            if ctx.cluster.mark_done(rnd):
                return RoundResult(Outcome.SUCCEEDED)
        watch = ctx.current.watch
        assert watch is not None
        watch.watch_all_done()
        ctx.say("local workers finished; waiting for the other nodes")
        return None

    def _silence(self, rnd: Round) -> RoundResult | None:
        """A store call on a cut link never returns: silence is judged by arithmetic, as is an overdue culprit."""
        watch = self.ctx.current.watch
        silent = watch.store_silence() if watch else None
        if silent is None:  # answering, or silent for less than its grace (cluster.peers, decide.liveness)
            return inquiry.overdue(self.ctx, rnd)
        return handle_silence(self.ctx, rnd, StoreLost(
            f"the rendezvous store at {rnd.store_host}:{rnd.store_port} has not answered for {silent:.1f} s "
            "(this node may be cut off)"))

    # ---- rounds ---------------------------------------------------------------------------------

    def _join(self) -> Round | int:
        ctx, cfg = self.ctx, self.ctx.cfg
        previous = self._after[0] if self._after else None
        for feature in ctx.features:
            if (code := feature.before_join(ctx, previous)) is not None:
                return code  # this node stays out (a health check failed)
        began = ctx.clock()
        ctx.say(f"joining rendezvous ({cfg.rendezvous.backend} {cfg.rendezvous.endpoint}, nodes {cfg.rendezvous.min_nodes}:{cfg.rendezvous.max_nodes})")
        progress = join_progress(ctx)  # lines while the other nodes are awaited
        try:
            with progress, ctx.guard.around(cfg.rendezvous.join_timeout + 60, "joining the rendezvous"), \
                    ctx.wakeup.interruptible():
                rnd = ctx.rendezvous.next_round(*(self._after or ()))
        except Interrupted as stop:  # Ctrl-C, or a preemption, while waiting for the other nodes
            ctx.wakeup.take_signal()
            return leaving.stop_outside_round(ctx, stop.signum)
        except RendezvousClosed as err:
            ctx.departure = Departure.NONE  # closed already, by the node that ended the job
            ended = next((line for feature in ctx.features if (line := feature.closed(ctx)) is not None), None)
            return finish(ctx, *ended) if ended else finish(ctx, exitcodes.OK, str(err))
        except RendezvousFailed as err:
            return finish(ctx, exitcodes.RENDEZVOUS, progress.report.timed_out() if timed_out(err) else str(err))
        ctx.round = rnd
        ctx.log.group_rank = rnd.group_rank
        ctx.log.emit("rendezvous", round=rnd.index, group_world_size=rnd.group_world_size,
                     world_size=rnd.world_size, rank_offset=rnd.rank_offset, master_addr=rnd.master_addr,
                     master_port=rnd.master_port, restart_count=rnd.restart_count,
                     seconds=round(ctx.clock() - began, 3), fast=rnd.fast,
                     **({"fallback": rnd.fallback} if rnd.fallback else {}),
                     **({"woken": True} if rnd.woken else {}))
        ctx.summary.restarts = rnd.restart_count
        signum = ctx.wakeup.take_signal()
        if signum is not None:  # the round formed with this node: it is stopped (or leaves) as from within
            return leaving.conclude(ctx, rnd, leaving.stop_for_signal(ctx, rnd, signum, workers=False))
        return rnd

    def _run_round(self, rnd: Round) -> RoundResult:
        ctx = self.ctx
        ctx.wakeup.take_events()  # dropped: the previous round's (late monitor verdicts, peer messages); signals stay
        state = ctx.current = RoundState(started=ctx.clock(), watch=ctx.cluster.watch(rnd, ctx.wakeup.post))
        watch = state.watch
        assert watch is not None
        watch.watch_inquiry(0)
        try:
            for feature in ctx.features:
                feature.round_begins(ctx, rnd)
            ctx.group.start(rnd)
            for feature in ctx.features:
                feature.workers_started(ctx, rnd, [w.local_rank for w in ctx.group.workers])
            ctx.say(f"started {len(ctx.group.workers)} workers, ranks {rnd.rank_offset}-"
                    f"{rnd.rank_offset + len(ctx.group.workers) - 1} of {rnd.world_size} (round {rnd.index}, "
                    f"restart {rnd.restart_count}, master {rnd.master_addr}:{rnd.master_port})")
            return self._watch(rnd)
        finally:
            watch.cancel()
            # Stops what is left; nothing (no signal, no /proc scan) when the round's end stopped them already
            ctx.group.stop(rnd, grace=ctx.cfg.workers.shutdown_timeout)

    def _conclude(self, rnd: Round, result: RoundResult) -> int | None:
        """The exit code when the round's end ends the job for this node; None: join the next round."""
        ctx = self.ctx
        for feature in ctx.features:
            feature.round_ended(ctx, result)
        if result.outcome in (Outcome.SIGNALED, Outcome.LEFT):
            return leaving.conclude(ctx, rnd, result)
        if result.outcome is Outcome.SUCCEEDED:
            return finish(ctx, exitcodes.OK, "all workers succeeded")
        message = result.message
        assert message is not None
        if result.outcome is Outcome.EXCLUDED:
            ctx.departure = Departure.LEAVE
            return finish(ctx, exitcodes.EXCLUDED, message.reason)
        if result.outcome is Outcome.FINAL or message.final:
            return finish(ctx, *final_code(ctx, message))
        signum = ctx.wakeup.take_signal()  # one that came while the round stopped: the job ends here
        if signum is None:
            self._after = (rnd, fast_blocker(ctx, rnd, result))
            backoff = bounded_backoff(ctx, message.backoff)  # a peer's number: never NaN, never past the max
            ctx.log.emit("restart", round=rnd.index, restart_count=message.restart_count,
                         max_restarts=ctx.cfg.policy.max_restarts, scope="job", backoff=backoff)
            if not message.membership:
                count = "?" if message.restart_count is None else message.restart_count
                ctx.say(f"restarting all ranks: {message.reason} (restart {count} of {ctx.cfg.policy.max_restarts})")
            if back_off(ctx, backoff, None if message.origin == ctx.node else message.origin):
                return None
            signum = ctx.wakeup.take_signal()
            assert signum is not None  # the back-off ends early only for a signal
        return leaving.stop_outside_round(ctx, signum, phase="while restarting")


def fast_blocker(ctx: Context, rnd: Round, result: RoundResult) -> str | None:
    """Why the next round after a job-wide restart must be a full c10d join (membership may change), or None:
    the same agents take the fast path (``cluster.fastround``). One agent's no aborts it for all."""
    message = result.message
    if message is None:
        return "the round ended without a decision"
    if message.membership:
        return "nodes wait to join"
    if message.exclude:
        return f"node {message.exclude} left the job"
    if any(f.cause is Cause.PEER and f.round == rnd.index for f in ctx.summary.failures):
        return "a node was lost"
    try:
        with ctx.store_call("asking whether nodes wait to join"):
            gone = ctx.cluster.left(rnd)
            waiting = 0 if gone else ctx.rendezvous.spare_count()
    except Exception as err:  # the join that follows meets the same store and reports it
        return f"could not ask whether nodes wait ({type(err).__name__})"
    if gone:
        return f"group rank(s) {sorted(gone)} left the job"
    return f"{waiting} node(s) wait outside the round" if waiting else None


# ---- crashes: workers that exited with an error -----------------------------------------------------------

CASCADE_WAIT = 0.5  # seconds to wait for a local peer's exit when the failed ranks only lost their peer


def handle_crashes(ctx: Context, rnd: Round, failed: Sequence[Worker]) -> RoundResult | None:
    """Record and act on crashes; ranks that all died of a collective timeout open the hang inquiry."""
    if ctx.current.inquiry.elsewhere and ctx.current.inquiry.quiet(ctx.clock()):
        # A verdict named a culprit elsewhere a moment ago: these ranks lost it, and its node ends the round.
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
    # The policy weighs the first record: a rank that only lost its peer is that peer's consequence, not the cause
    # (rank 1 exits 17, rank 0's all_reduce dies of it in the same instant: the 17 decides).
    failed = sorted(failed, key=lambda w: peer_gone(lines[w.local_rank]) is not None)
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
    """The failed ranks only lost their peer, which is exiting too: its exit is the failure to act on."""
    deadline = ctx.clock() + CASCADE_WAIT
    while (left := deadline - ctx.clock()) > 0:
        ctx.wakeup.wait(ctx.group.pidfds(), left)
        more = [w for w in ctx.group.reap(rnd) if w.status is not None and not w.status.ok]
        if more:
            return more
    return []


def crash_record(ctx: Context, rnd: Round, worker: Worker, section: str | None) -> FailureRecord:
    assert worker.status is not None
    error_file = ErrorFile.read(Path(worker.spec.env["TORCHELASTIC_ERROR_FILE"]))
    return FailureRecord(round=rnd.index, rank=worker.rank, local_rank=worker.local_rank, node=ctx.node,
                         group_rank=rnd.group_rank, cause=Cause.CRASH, status=worker.status, pid=worker.pid,
                         section=section, error_file=error_file)
