"""The per-node agent: rendezvous, spawn, watch, decide, restart.

One loop with fixed steps (``run``): join a round -> start the workers -> wait for the next event ->
ask the policy -> act -> repeat. Events arrive on one queue: worker exits (pidfds), rank monitor verdicts,
peer stop messages, lost peers, signals (handlers only enqueue), membership checks (a timer). The wait is
a ``select`` over the worker pidfds, the monitor's pidfd and a wake-up pipe that every thread and signal
handler writes to.

Round states::

    JOINING --> RUNNING --> SUCCEEDED --> (all nodes done) --> exit 0
                   |  \\--> FAILED (crash / hang / lost monitor / lost peer) --> policy:
                   |          restart job   --> stop message to all nodes --> JOINING
                   |          restart node/rank --> respawn locally --> RUNNING
                   |          exclude node  --> leave the rendezvous --> exit 6 (the others go on)
                   |          stop          --> final stop message --> exit 1
                   \\--> STOPPED (a peer's message, membership change) --> JOINING (or exit if final)
"""

from __future__ import annotations

import enum
import functools
import os
import queue
import select
import signal
import socket
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mbr_launch.report import exitcodes
from mbr_launch.config.model import LaunchConfig
from mbr_launch.report.events import EventLog
from mbr_launch.workers.group import WorkerGroup
from mbr_launch.cluster.peers import PeerWatch
from mbr_launch.decide.policy import Action, FailureFacts, decide, keep_store_host, quick_failure
from mbr_launch.cluster.rendezvous import (Rendezvous, RendezvousClosed, RendezvousFailed, Round, StopWatcher, hosts_store,
                         publish_stop, read_stop)
from mbr_launch.cluster.storeguard import StoreGuard
from mbr_launch.agent.telemetry import Telemetry
from mbr_launch.report.summary import ErrorFile, FailureRecord, RunSummary
from mbr_launch.workers.process import Worker


# Seconds the agent serving the rendezvous store keeps it up after closing the rendezvous, when agents wait
# outside the round (spares): they poll about once a second and should read "closed", not find it gone.
SPARE_LINGER = 3.0


class Outcome(enum.Enum):
    SUCCEEDED = "succeeded"
    RESTART = "restart"  # a new rendezvous round, decided by us or a peer
    FINAL = "final"  # the job ends (message says why and with which code)
    EXCLUDED = "excluded"  # this node leaves the job
    SIGNALED = "signaled"


@dataclass
class RoundResult:
    outcome: Outcome
    message: dict[str, Any] = field(default_factory=dict)
    signum: int | None = None


class Agent:
    def __init__(self, cfg: LaunchConfig, *, environ: dict[str, str] | None = None,
                 standby: Any = None, exit_after: bool = False) -> None:
        self.cfg = cfg
        self._exit_after = exit_after  # the process ends (os._exit) as soon as run() returns
        self._early_standby = standby  # a StandbyPool the launcher started before importing torch
        self.environ = dict(os.environ if environ is None else environ)
        self.node = socket.gethostname()
        self.summary = RunSummary()
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._wake_r, self._wake_w = -1, -1
        self._monitor: Any = None
        self._rdzv: Rendezvous | None = None
        self._round: Round | None = None
        self.group: WorkerGroup | None = None
        self._threads: list[Any] = []  # this round's watcher threads (StopWatcher, PeerWatch)
        self._peer_watch: PeerWatch | None = None
        self._guard = StoreGuard(self._store_hung)
        self._t0 = time.monotonic()
        self._round_started = 0.0
        self._heartbeats: set[int] = set()  # local ranks that sent a first heartbeat this round
        self._quick_failures = 0  # consecutive failures of short-lived rounds (a crash loop)
        self.run_dir: Path | None = None
        self.sock_dir: Path | None = None
        self.log: EventLog | None = None
        self.telemetry: Telemetry | None = None  # step beats: stragglers, goodput, status display
        # How to part from the rendezvous at exit: close it for all (the job is over), leave it (this node
        # is excluded, the others go on), or nothing (its store is unreachable).
        self._farewell = "close"

    @property
    def workers(self) -> list[Worker]:
        return self.group.workers if self.group else []

    # ---- top level ------------------------------------------------------------------------------

    def run(self) -> int:
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        old_handlers = self._install_signals()
        self._guard.start()
        try:
            self._prepare_dirs()
            assert self.group
            self.group.start_standbys(self._early_standby)  # warm workers prepare while the rendezvous runs
            self._start_monitor()
            return self._loop()
        finally:
            self._teardown(old_handlers)

    def _loop(self) -> int:
        cfg = self.cfg
        self._rdzv = Rendezvous(cfg)
        while True:
            began = time.monotonic()
            self.say(f"joining rendezvous ({cfg.rendezvous.backend} {cfg.rendezvous.endpoint}, "
                     f"nodes {cfg.rendezvous.min_nodes}:{cfg.rendezvous.max_nodes})")
            try:
                with self._guard.around(cfg.rendezvous.join_timeout + 60, "joining the rendezvous"):
                    rnd = self._rdzv.next_round()
            except RendezvousClosed as err:
                self._farewell = "none"  # closed already, by the node that ended the job
                return self._finish(exitcodes.OK, str(err))
            except RendezvousFailed as err:
                return self._finish(exitcodes.RENDEZVOUS, str(err))
            signum = self._pending_signal()
            if signum is not None:
                return self._finish_signaled(signum, rnd)
            self._round = rnd
            assert self.log
            self.log.group_rank = rnd.group_rank
            self.log.emit("rendezvous", round=rnd.index, group_world_size=rnd.group_world_size,
                          world_size=rnd.world_size, rank_offset=rnd.rank_offset,
                          master_addr=rnd.master_addr, master_port=rnd.master_port,
                          restart_count=rnd.restart_count, seconds=round(time.monotonic() - began, 3))
            self.summary.restarts = rnd.restart_count
            result = self._run_round(rnd)
            if result.outcome is Outcome.SIGNALED:
                assert result.signum is not None
                return self._finish_signaled(result.signum, rnd)
            if result.outcome is Outcome.SUCCEEDED:
                return self._finish(exitcodes.OK, "all workers succeeded")
            if result.outcome is Outcome.EXCLUDED:
                self._farewell = "leave"
                return self._finish(exitcodes.EXCLUDED, result.message.get("reason", "node excluded"))
            message = result.message
            if result.outcome is Outcome.FINAL or message.get("final"):
                return self._finish(int(message.get("exit_code", exitcodes.FAILED)),
                                    message.get("reason", "job failed"))
            self.log.emit("restart", round=rnd.index, restart_count=message.get("restart_count"),
                          max_restarts=cfg.policy.max_restarts, scope="job", backoff=message.get("backoff", 0))
            if not message.get("membership"):
                self.say(f"restarting all ranks: {message.get('reason', '')} "
                         f"(restart {message.get('restart_count', '?')} of {cfg.policy.max_restarts})")
            if not self._sleep(float(message.get("backoff", 0) or 0)):
                signum = self._pending_signal()
                assert signum is not None
                return self._finish_signaled(signum, rnd)

    # ---- one round ------------------------------------------------------------------------------

    def _run_round(self, rnd: Round) -> RoundResult:
        self._drain_stale_events()
        self._heartbeats = set()
        self._round_started = time.monotonic()
        cfg = self.cfg
        stop_watch = StopWatcher(rnd, lambda msg: self._post("peer_stop", msg))
        membership = cfg.rendezvous.backend == "c10d" and not cfg.rendezvous.standalone
        assert self._rdzv
        self._peer_watch = PeerWatch(rnd, timeout=cfg.rendezvous.peer_timeout,
                                     on_lost=lambda ev: self._post("peer", ev),
                                     waiting=self._rdzv.num_nodes_waiting if membership else None,
                                     on_waiting=lambda count: self._post("membership", count))
        self._threads = [stop_watch, self._peer_watch]
        for thread in self._threads:
            thread.start()
        assert self.group
        try:
            self.group.start(rnd)
            if self.telemetry:
                self.telemetry.begin(rnd.index, [w.local_rank for w in self.workers])
            self.say(f"started {len(self.workers)} workers, ranks {rnd.rank_offset}-"
                     f"{rnd.rank_offset + len(self.workers) - 1} of {rnd.world_size} (round {rnd.index}, "
                     f"restart {rnd.restart_count}, master {rnd.master_addr}:{rnd.master_port})")
            return self._watch(rnd)
        finally:
            for thread in self._threads:
                thread.cancel()
            self.group.stop(rnd, grace=self.cfg.workers.shutdown_timeout)

    def _watch(self, rnd: Round) -> RoundResult:
        """Wait for events until this round ends for this node."""
        cfg = self.cfg
        tick = min(0.5, cfg.rendezvous.peer_timeout / 4)
        local_done = False
        assert self.group
        while True:
            self._wait_events(tick)
            failed = [w for w in self.group.reap(rnd) if w.status is not None and not w.status.ok]
            if failed and not local_done:
                result = self._failure(rnd, [self._crash_record(rnd, w) for w in failed])
                if result is not None:
                    return result
            while True:
                try:
                    kind, payload = self._events.get_nowait()
                except queue.Empty:
                    break
                result = self._dispatch(rnd, kind, payload, local_done)
                if result is not None:
                    return result
            due = self.telemetry.next_tick() if self.telemetry and not local_done else None
            if due is not None and time.monotonic() >= due:
                result = self._tick_telemetry(rnd)
                if result is not None:
                    return result
            if not local_done and self.group.all_succeeded():
                local_done = True
                if self._node_done(rnd):
                    return RoundResult(Outcome.SUCCEEDED)
                self.say("local workers finished; waiting for the other nodes")
            # A store call on a cut-off link never returns, so silence is judged here, by arithmetic.
            silent = self._peer_watch.silent_for() if self._peer_watch else 0.0
            if silent > cfg.rendezvous.peer_timeout:
                return self._handle_lost_peer(rnd, {"kind": "store_lost", "detail": (
                    f"the rendezvous store at {rnd.store_host}:{rnd.store_port} has not answered for "
                    f"{silent:.1f} s (this node may be cut off)")})  # type: ignore[return-value]

    def _dispatch(self, rnd: Round, kind: str, payload: Any, local_done: bool) -> RoundResult | None:
        if kind == "signal":
            return self._handle_signal(rnd, payload)
        if kind == "peer_stop":
            return self._handle_peer_stop(rnd, payload)
        if kind == "peer":
            return self._handle_lost_peer(rnd, payload)
        if kind == "all_done":
            return RoundResult(Outcome.SUCCEEDED)
        if kind == "membership" and not local_done:
            message = {"reason": f"{payload} node(s) waiting to join", "origin": self.node, "final": False,
                       "restart_count": rnd.restart_count, "membership": True}
            with self._guard.around(self.cfg.rendezvous.peer_timeout * 2 + 5, "announcing a membership change"):
                publish_stop(rnd, message)
                decided = read_stop(rnd) or message
            assert self.group
            self.group.stop(rnd, grace=self.cfg.workers.shutdown_timeout)
            return RoundResult(Outcome.FINAL if decided.get("final") else Outcome.RESTART, message=decided)
        if kind == "monitor" and not local_done:
            return self._handle_monitor_event(rnd, payload)
        return None

    # ---- handlers -------------------------------------------------------------------------------

    def _handle_signal(self, rnd: Round, signum: int) -> RoundResult:
        name = signal.Signals(signum).name
        assert self.log and self.group
        self.log.emit("signal", signal=name)
        cfg = self.cfg
        if name in cfg.preemption.signals:
            forward, grace = signal.Signals[cfg.preemption.forward_signal], cfg.preemption.grace
            self.log.emit("preemption", signal=name, forward=forward.name, grace=grace)
            self.say(f"PREEMPTION ({name}): sending {forward.name} to the workers so they can checkpoint, "
                     f"then stopping them after {grace:g} s")
        else:
            forward, grace = signal.Signals(signum), cfg.workers.shutdown_timeout
            self.say(f"received {name}: forwarding it to the workers, then stopping them (grace {grace:g} s)")
        self.group.stop(rnd, first_signal=forward, grace=grace)
        message = {"reason": f"{name} on node {self.node}", "origin": self.node, "final": True,
                   "exit_code": exitcodes.FAILED}
        try:
            with self._guard.around(self.cfg.rendezvous.peer_timeout * 2 + 5,
                                    "telling the other nodes about the signal"):
                publish_stop(rnd, message)
        except Exception:
            pass  # the store may be gone too; our own exit does not depend on it
        return RoundResult(Outcome.SIGNALED, signum=signum)

    def _handle_peer_stop(self, rnd: Round, message: dict) -> RoundResult:
        assert self.log and self.group
        self.log.emit("stop", round=rnd.index, reason=message.get("reason"), origin=message.get("origin"))
        if message.get("group_rank") != rnd.group_rank:
            self.say(f"stopping local workers: {message.get('reason')} (from {message.get('origin')})")
        self.group.stop(rnd, grace=self.cfg.workers.shutdown_timeout)
        return RoundResult(Outcome.FINAL if message.get("final") else Outcome.RESTART, message=message)

    def _handle_lost_peer(self, rnd: Round, event: dict) -> RoundResult | None:
        assert self.log and self.group
        kind = event.get("kind")
        detail = event.get("detail") or (f"the agent of group rank {event.get('group_rank')} has been silent "
                                         f"for {event.get('silent_for')} s (dead or cut off)")
        self.log.emit("peer_lost", round=rnd.index, kind=kind, detail=detail)
        if kind == "store_lost":
            self._farewell = "none"  # nothing to tell a store we cannot reach
            self.say(f"LOST THE RENDEZVOUS STORE: {detail}; stopping local workers")
            self.group.stop(rnd, grace=self.cfg.workers.shutdown_timeout)
            return RoundResult(Outcome.FINAL, message={"reason": f"lost the rendezvous store: {detail}",
                                                       "exit_code": exitcodes.RENDEZVOUS, "final": True})
        record = FailureRecord(round=rnd.index, rank=-1, local_rank=-1, node=f"group rank {event.get('group_rank')}",
                               group_rank=int(event.get("group_rank", -1)), cause="peer", status=None,
                               detail=detail)
        return self._failure(rnd, [record], nodes_lost=1)

    def _handle_monitor_event(self, rnd: Round, event: dict) -> RoundResult | None:
        name = event.get("ev")
        assert self.log
        if name in ("first_heartbeat", "first_step"):
            self._heartbeats.add(int(event.get("local_rank", -1)))
            if name == "first_step" and self.telemetry:
                self.telemetry.on_first_step(event)
            return None
        if name in ("steps", "status"):
            if self.telemetry:
                (self.telemetry.on_steps if name == "steps" else self.telemetry.on_status)(event)
            return None
        if name == "expired":
            return self._hang(rnd, event)
        if name == "monitor_exit":
            self.log.emit("monitor_lost", round=rnd.index, exit_code=event.get("code"))
            record = FailureRecord(round=rnd.index, rank=-1, local_rank=-1, node=self.node,
                                   group_rank=rnd.group_rank, cause="monitor", status=None,
                                   detail=f"the rank monitor process died (exit {event.get('code')}); "
                                          "hang detection was lost, so the round is restarted")
            self._start_monitor(restart=True)
            return self._failure(rnd, [record])
        if name == "workload_request":
            self.log.emit("workload_request", rank=event.get("rank"), action=event.get("action"),
                          description=event.get("description"))
            action = event.get("action")
            if action in ("ShutdownWorkload", "ExcludeThisNode"):
                record = FailureRecord(round=rnd.index, rank=int(event.get("rank", -1)), local_rank=-1,
                                       node=self.node, group_rank=rnd.group_rank, cause="request", status=None,
                                       detail=f"rank {event.get('rank')} requested {action}: "
                                              f"{event.get('description')}")
                return self._failure(rnd, [record], shutdown=action == "ShutdownWorkload",
                                     exclude=action == "ExcludeThisNode")
        return None

    def _hang(self, rnd: Round, event: dict) -> RoundResult | None:
        from mbr_launch.agent import hangs

        assert self.log and self.group
        local_rank = int(event.get("local_rank", -1))
        worker = self.group.by_local_rank(local_rank)
        if worker is None or not worker.alive:
            return None  # already gone: its exit is (or will be) handled as a crash
        self.log.emit("hang", round=rnd.index, rank=event.get("rank"), local_rank=local_rank,
                      pid=event.get("pid"), kind=event.get("kind"), section=event.get("section"),
                      timeout=event.get("timeout"), elapsed=event.get("elapsed"),
                      last_heartbeat_age=event.get("last_heartbeat_age"),
                      open_sections=event.get("open_sections"))
        self.say(f"HANG: rank {event.get('rank')} {hangs.describe(event)}; dumping stacks, then stopping it")
        dumps = hangs.dump_all(self, rnd)
        record = FailureRecord(round=rnd.index, rank=worker.rank, local_rank=local_rank, node=self.node,
                               group_rank=rnd.group_rank, cause="hang", status=None, pid=worker.pid,
                               section=event.get("section"), detail=hangs.describe(event))
        hung = next((d for d in dumps if d.get("local_rank") == local_rank), None)
        if hung:
            record.stacks, record.stack_summary = hung.get("path"), hung.get("summary")
        self.group.stop(rnd, local_ranks=[local_rank], grace=self.cfg.monitor.hang_kill_grace)
        return self._failure(rnd, [record])

    def _tick_telemetry(self, rnd: Round) -> RoundResult | None:
        assert self.telemetry
        report = self.telemetry.tick(rnd.index)
        if report is None or not report.stragglers or not self.telemetry.stop_on_straggler:
            return None
        rank = report.stragglers[0]
        score = report.scores[rank]
        local = next((w.local_rank for w in self.workers if w.rank == rank), -1)
        record = FailureRecord(round=rnd.index, rank=rank, local_rank=local, node=self.node,
                               group_rank=rnd.group_rank, cause="straggler", status=None,
                               detail=f"straggler: relative score {score.relative:.2f}, individual "
                                      f"{score.individual:.2f} below {report.threshold:g} (--stop-on-straggler)")
        return self._failure(rnd, [record], shutdown=True)

    def _goodput(self) -> None:
        """Goodput of this node's run, from its event log: into the summary and the log."""
        from mbr_launch.decide.goodput import compute

        assert self.log
        if not any(r.get("event") == "progress" for r in self.log.records):
            return
        result = compute(self.log.records, wall=self.log.t_of(time.monotonic()))
        self.summary.goodput = result.render()
        self.log.emit("goodput", **result.to_event())

    def _crash_record(self, rnd: Round, worker: Worker) -> FailureRecord:
        assert worker.status is not None
        error_file = ErrorFile.read(Path(worker.spec.env["TORCHELASTIC_ERROR_FILE"]))
        return FailureRecord(round=rnd.index, rank=worker.rank, local_rank=worker.local_rank, node=self.node,
                             group_rank=rnd.group_rank, cause="crash", status=worker.status, pid=worker.pid,
                             section=self._last_section(worker.local_rank), error_file=error_file)

    # ---- the policy applied ---------------------------------------------------------------------

    def _failure(self, rnd: Round, records: list[FailureRecord], *, shutdown: bool = False,
                 exclude: bool = False, nodes_lost: int = 0) -> RoundResult | None:
        """Record failures, ask the policy, act. None when the round goes on (node/rank-scope restart)."""
        assert self.log and self._rdzv and self.group
        cfg = self.cfg
        for record in records:
            self.summary.failures.append(record)
            self.log.emit("failure", **record.to_event(), startup=not self._heartbeats)
            self.say(f"FAILURE: {record.describe()}")
        if self.telemetry:
            self.telemetry.end("failure", records[0].cause)
        first = records[0]
        with self._guard.around(self.cfg.rendezvous.peer_timeout * 2 + 5,
                                "recording a failure in the rendezvous store"):
            restarts, startup_restarts = self._rdzv.counts(rnd)
            node_failures = self._rdzv.count_node_failure(rnd, self.node) if first.cause in ("crash", "hang") else 0
            waiting = self._rdzv.spare_count()
        round_seconds = time.monotonic() - self._round_started
        facts = FailureFacts(
            cause=first.cause, exit_code=first.status.code if first.status else None,
            startup=not self._heartbeats, round_seconds=round_seconds, restarts_used=restarts,
            startup_restarts_used=startup_restarts, node_failures=node_failures,
            quick_failures=self._quick_failures, exclude_requested=exclude, shutdown_requested=shutdown,
            nodes_left=rnd.group_world_size - 1 - nodes_lost + waiting,
            nodes_remaining=rnd.group_world_size - nodes_lost + waiting)
        decision = decide(cfg.policy, facts)
        if decision.action is Action.EXCLUDE_NODE and hosts_store(rnd.store_port):
            # Leaving would take the rendezvous store down with this process, and every other node with it.
            decision = keep_store_host(decision, restarts_used=restarts, max_restarts=cfg.policy.max_restarts)
            self.say(f"this node hosts the rendezvous store ({rnd.store_host}:{rnd.store_port}), so it stays: "
                     f"{decision.reason}")
        self._quick_failures = self._quick_failures + 1 if quick_failure(cfg.policy, facts) else 0
        reason = f"{first.describe()}; {decision.reason}" if decision.action is not Action.RESTART \
            else first.describe()

        if decision.action is Action.RESTART and decision.scope != "job":
            with self._guard.around(self.cfg.rendezvous.peer_timeout * 2 + 5, "counting a restart"):
                total = self._rdzv.count_restart(rnd, startup=decision.counts_as_startup, once_per_round=False)
            ranks = sorted({r.local_rank for r in records}) if decision.scope == "rank" else None
            self.group.stop(rnd, local_ranks=ranks, grace=cfg.workers.shutdown_timeout)
            self.log.emit("restart", round=rnd.index, restart_count=total, max_restarts=cfg.policy.max_restarts,
                          scope=decision.scope, backoff=decision.backoff)
            self.say(f"restarting {'this node' if ranks is None else 'rank(s) ' + str([rnd.rank_offset + r for r in ranks])}"
                     f" only (--restart-scope {decision.scope}; restart {total} of {cfg.policy.max_restarts})")
            if not self._sleep(decision.backoff):
                return self._handle_signal(rnd, self._pending_signal() or signal.SIGTERM)
            self._heartbeats = set() if ranks is None else self._heartbeats - set(ranks)
            self.group.start(rnd, ranks, restart_count=total)
            if self.telemetry:
                self.telemetry.begin(rnd.index, ranks if ranks is not None else [w.local_rank for w in self.workers])
            return None

        if decision.action is Action.EXCLUDE_NODE:
            message = {"reason": f"node {self.node} leaves the job: {decision.reason}", "origin": self.node,
                       "group_rank": rnd.group_rank, "final": False, "exclude": self.node,
                       "restart_count": rnd.restart_count}
            self.log.emit("exclude", round=rnd.index, reason=decision.reason)
            with self._guard.around(self.cfg.rendezvous.peer_timeout * 2 + 5, "announcing the exclusion"):
                publish_stop(rnd, message)
            self.group.stop(rnd, grace=cfg.workers.shutdown_timeout)
            return RoundResult(Outcome.EXCLUDED, message=message)

        final = decision.action is Action.STOP
        message = {"reason": reason, "origin": self.node, "group_rank": rnd.group_rank, "final": final,
                   "exit_code": exitcodes.FAILED, "restart_count": rnd.restart_count, "backoff": decision.backoff}
        with self._guard.around(self.cfg.rendezvous.peer_timeout * 2 + 5, "announcing the failure to the other nodes"):
            if not final:
                message["restart_count"] = self._rdzv.count_restart(rnd, startup=decision.counts_as_startup,
                                                                    once_per_round=True)
            publish_stop(rnd, message)
            decided = read_stop(rnd) or message  # when two nodes fail at once, the first message wins
        self.group.stop(rnd, grace=cfg.workers.shutdown_timeout)
        return RoundResult(Outcome.FINAL if decided.get("final") else Outcome.RESTART, message=decided)

    def _node_done(self, rnd: Round) -> bool:
        """Mark this node done; True when every node of the round is done."""
        with self._guard.around(self.cfg.rendezvous.peer_timeout * 2 + 5, "reporting this node done"):
            done = int(rnd.control.add("done_count", 1))
            if done >= rnd.group_world_size:
                rnd.control.set("all_done", "1")
                return True
        watcher = StopWatcher(rnd, lambda _msg: self._post("all_done", None), key="all_done")
        self._threads.append(watcher)
        watcher.start()
        return False

    def _last_section(self, local_rank: int) -> str | None:
        if not self._monitor:
            return None
        try:
            snap = self._monitor.snapshot(timeout=1.0)
        except Exception:
            return None
        for entry in snap.get("ranks", []):
            if entry.get("local_rank") == local_rank and entry.get("open_sections"):
                return ",".join(entry["open_sections"])
        return None

    # ---- monitor --------------------------------------------------------------------------------

    def _start_monitor(self, restart: bool = False) -> None:
        if not self.cfg.monitor.enabled:
            return
        from mbr_launch.monitor.link import MonitorLink

        self._monitor = MonitorLink(lambda ev: self._post("monitor", ev), env=dict(self.environ))
        assert self.sock_dir
        self._monitor.start(self.sock_dir, self.cfg.ft.as_nvrx_dict(),
                            steps=self.telemetry.monitor_config() if self.telemetry else None)
        if self.group:
            self.group.monitor = self._monitor

    # ---- events, signals, plumbing --------------------------------------------------------------

    def _post(self, kind: str, payload: Any) -> None:
        """Thread-safe: queue an event and wake the loop."""
        self._events.put((kind, payload))
        try:
            os.write(self._wake_w, b"\0")
        except OSError:
            pass

    def _wait_events(self, timeout: float | None) -> None:
        fds = [self._wake_r] + (self.group.pidfds() if self.group else [])
        monitor_fd = self._monitor.pidfd if self._monitor else None
        if monitor_fd is not None:
            fds.append(monitor_fd)
        if self._events.qsize():
            timeout = 0
        ready, _, _ = select.select(fds, [], [], timeout)
        if self._wake_r in ready:
            try:
                while os.read(self._wake_r, 4096):
                    pass
            except BlockingIOError:
                pass
        if monitor_fd is not None and monitor_fd in ready and self._monitor:
            code = self._monitor.exit_code()
            os.close(monitor_fd)
            self._monitor.pidfd = None
            self._monitor = None
            if self.group:
                self.group.monitor = None
            self._post("monitor", {"ev": "monitor_exit", "code": code})

    def _sleep(self, seconds: float) -> bool:
        """Back-off that a signal interrupts; False when a signal arrived."""
        deadline = time.monotonic() + seconds
        while (remaining := deadline - time.monotonic()) > 0:
            if self._pending_signal() is not None:
                return False
            select.select([self._wake_r], [], [], remaining)
        return self._pending_signal() is None

    def _drain_stale_events(self) -> None:
        """Drop events of the previous round (late monitor verdicts, peer messages); keep signals."""
        keep = []
        while True:
            try:
                kind, payload = self._events.get_nowait()
            except queue.Empty:
                break
            if kind == "signal":
                keep.append((kind, payload))
        for item in keep:
            self._events.put(item)

    def _pending_signal(self) -> int | None:
        items, found = [], None
        while True:
            try:
                item = self._events.get_nowait()
            except queue.Empty:
                break
            if item[0] == "signal" and found is None:
                found = item[1]
            items.append(item)
        for item in items:
            self._events.put(item)
        return found

    def _install_signals(self) -> dict[int, Any]:
        old = {}

        def handler(signum: int, _frame: Any) -> None:
            # Only record the signal: no logging or I/O here (the logging lock can deadlock).
            self._events.put(("signal", signum))
            try:
                os.write(self._wake_w, b"\0")
            except OSError:
                pass

        for name in dict.fromkeys((*self.cfg.workers.signals_to_handle, *self.cfg.preemption.signals)):
            sig = signal.Signals[name]
            old[sig] = signal.signal(sig, handler)
        return old

    def _prepare_dirs(self) -> None:
        cfg = self.cfg
        base = Path(cfg.output.log_dir) if cfg.output.log_dir else Path(tempfile.gettempdir()) / "mbr-launch"
        base.mkdir(parents=True, exist_ok=True)
        self.run_dir = base / f"{cfg.rendezvous.run_id}_{uuid.uuid4().hex[:6]}_{self.node}"
        self.run_dir.mkdir(parents=True)
        # Sockets live in a private directory (0700), never directly in the shared temp dir.
        self.sock_dir = Path(tempfile.mkdtemp(prefix="mbr-"))
        self.log = EventLog(self.run_dir / "events.jsonl", node=self.node)
        self.group = WorkerGroup(cfg, environ=self.environ, run_dir=self.run_dir, sock_dir=self.sock_dir,
                                 log=self.log, monitor=None, say=self.say)
        slurm = cfg.slurm
        self.log.emit("start", argv=sys.argv, run_id=cfg.rendezvous.run_id,
                      nproc_per_node=cfg.workers.nproc_per_node,
                      nnodes=f"{cfg.rendezvous.min_nodes}:{cfg.rendezvous.max_nodes}",
                      max_restarts=cfg.policy.max_restarts, log_dir=str(self.run_dir),
                      slurm={"job": slurm.job_id, "step": slurm.step_id, "node": slurm.hostname,
                             "restart_count": slurm.restart_count} if slurm else None)
        for warning in cfg.warnings:
            self.say(f"WARNING: {warning}")
        self.telemetry = Telemetry(cfg, self.log, self.say,
                                   snapshot=lambda: self._monitor.snapshot(timeout=1.0) if self._monitor else None)

    def _teardown(self, old_handlers: dict[int, Any]) -> None:
        if self.group:
            try:
                self.group.stop(self._round, grace=self.cfg.workers.shutdown_timeout)
            except Exception:
                pass
            self.group.close()
        # A thread blocked inside a torch store call at interpreter exit aborts the process: join them,
        # unless the caller ends the process with os._exit right after (the CLI), which is safe and saves
        # up to one watcher poll (~1 s) at every exit.
        for thread in self._threads:
            thread.cancel()
        for thread in self._threads if not self._exit_after else ():
            thread.join(StopWatcher.POLL + 1.0)
        if self._monitor:
            self._monitor.close()
        if self._rdzv and self._farewell != "none":
            # Bounded: on a dead link these calls would never return.
            if self._farewell == "leave":
                part = self._rdzv.leave
            else:
                hosting = self._round is not None and hosts_store(self._round.store_port)
                part = functools.partial(self._rdzv.shutdown, linger=SPARE_LINGER if hosting else 0.0)
            farewell = threading.Thread(target=part, name="rdzv-farewell", daemon=True)
            farewell.start()
            farewell.join(5.0)
        self._guard.close()
        for sig, old in old_handlers.items():
            signal.signal(sig, old)
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
        if self.sock_dir:
            for item in self.sock_dir.iterdir():
                item.unlink(missing_ok=True)
            self.sock_dir.rmdir()
        if self.log:
            self.log.close()

    def _store_hung(self, what: str, seconds: float) -> None:
        """Watchdog thread: a store call has blocked past its bound (a cut link). Stop everything, exit 3."""
        for worker in self.workers:
            try:
                os.killpg(worker.pid, signal.SIGKILL)
            except OSError:
                pass
        reason = (f"lost the rendezvous store: {what} blocked for {seconds:.0f} s (this node may be cut off "
                  f"from {self.cfg.rendezvous.endpoint})")
        print(f"[mbr-launch {self.node}] LOST THE RENDEZVOUS STORE: {reason}", file=sys.stderr, flush=True)
        try:
            if self.log:
                self.log.emit("end", exit_code=exitcodes.RENDEZVOUS, reason=reason,
                              seconds=round(time.monotonic() - self._t0, 3))
                self.log.close()
            if self._monitor:
                self._monitor.close(timeout=2)
        finally:
            os._exit(exitcodes.RENDEZVOUS)

    def _finish_signaled(self, signum: int, rnd: Round | None) -> int:
        name = signal.Signals(signum).name
        if name not in self.cfg.preemption.signals:
            return self._finish(128 + signum, f"launcher received {name}")
        from mbr_launch.cluster.requeue import maybe_requeue

        requeued = maybe_requeue(self.cfg, rnd.group_rank if rnd else self.cfg.rendezvous.node_rank, self.say)
        if self.log and requeued is not None:
            self.log.emit("requeue", job=self.cfg.slurm.job_id if self.cfg.slurm else None, ok=requeued)
        return self._finish(exitcodes.PREEMPTED, f"preempted by {name}" + (" (job requeued)" if requeued else ""))

    def _finish(self, code: int, reason: str) -> int:
        self.summary.exit_code, self.summary.reason = code, reason
        assert self.log
        if self.telemetry:
            self.telemetry.end("end" if code == exitcodes.OK else "stop")
            self.telemetry.close()
        self._goodput()
        self.log.emit("end", exit_code=code, reason=reason, seconds=round(time.monotonic() - self._t0, 3))
        text = self.summary.render()
        if text:
            print(text, file=sys.stderr, flush=True)
        self.say(f"done: {reason} (exit code {code}); logs and events in {self.run_dir}")
        return code

    def say(self, message: str) -> None:
        if not self.cfg.output.quiet or message.startswith(("FAILURE", "HANG", "LOST", "PREEMPTION", "WARNING")):
            print(f"[mbr-launch {self.node}] {message}", file=sys.stderr, flush=True)
