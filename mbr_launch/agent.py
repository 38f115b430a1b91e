"""The per-node agent: rendezvous, spawn, watch, decide, restart.

One loop with fixed steps (``run``): join a round -> start the workers -> wait for the next event ->
act -> repeat. Events arrive on one queue: worker exits (pidfds), rank monitor verdicts, peer stop
messages, signals (handlers only enqueue), membership checks (a timer). The wait is a ``select`` over the
worker pidfds, the monitor's pidfd and a wake-up pipe that every thread and signal handler writes to.

Round states::

    JOINING --> RUNNING --> SUCCEEDED --> (all nodes done) --> exit 0
                   |  \\--> FAILED (local crash / hang / monitor lost) --+--> budget left --> JOINING
                   |                                                    \\-> budget spent --> exit 1
                   \\--> STOPPED (peer's failure, membership change) ----> JOINING (or exit 1 if final)
"""

from __future__ import annotations

import enum
import json
import os
import queue
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import exitcodes
from .config import LaunchConfig
from .events import EventLog
from .rendezvous import Rendezvous, RendezvousFailed, Round, StopWatcher, publish_stop, read_stop
from .summary import ErrorFile, FailureRecord, RunSummary
from .workers import ExitStatus, OutputPump, Worker, WorkerSpec, spawn, stop_all, wait_any


class Outcome(enum.Enum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"  # by a peer's message
    SIGNALED = "signaled"


@dataclass
class RoundResult:
    outcome: Outcome
    failures: list[FailureRecord] = field(default_factory=list)
    message: dict[str, Any] = field(default_factory=dict)
    signum: int | None = None


class Agent:
    def __init__(self, cfg: LaunchConfig, *, environ: dict[str, str] | None = None) -> None:
        self.cfg = cfg
        self.environ = dict(os.environ if environ is None else environ)
        self.node = socket.gethostname()
        self.summary = RunSummary()
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._wake_r, self._wake_w = -1, -1
        self._monitor = None
        self._rdzv: Rendezvous | None = None
        self._round: Round | None = None
        self._workers: list[Worker] = []
        self._watchers: list[StopWatcher] = []
        self._t0 = time.monotonic()
        self.run_dir: Path | None = None
        self.sock_dir: Path | None = None
        self.log: EventLog | None = None

    # ---- top level ------------------------------------------------------------------------------

    def run(self) -> int:
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        old_handlers = self._install_signals()
        try:
            self._prepare_dirs()
            self._start_monitor()
            return self._loop()
        finally:
            self._teardown(old_handlers)

    def _loop(self) -> int:
        cfg = self.cfg
        self._rdzv = Rendezvous(cfg)
        while True:
            began = time.monotonic()
            self.say(f"joining rendezvous ({cfg.rdzv_backend} {cfg.rdzv_endpoint}, "
                     f"nodes {cfg.min_nodes}:{cfg.max_nodes})")
            try:
                rnd = self._rdzv.next_round()
            except RendezvousFailed as err:
                return self._finish(exitcodes.RENDEZVOUS, f"rendezvous failed: {err}")
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
            if rnd.restart_count > cfg.max_restarts:
                return self._finish(exitcodes.FAILED, "restart budget exhausted "
                                    f"({rnd.restart_count - 1} of {cfg.max_restarts} restarts used)")
            self.summary.restarts = rnd.restart_count
            result = self._run_round(rnd)
            if result.outcome is Outcome.SIGNALED:
                assert result.signum is not None
                return self._finish_signaled(result.signum, rnd)
            if result.outcome is Outcome.SUCCEEDED:
                return self._finish(exitcodes.OK, "all workers succeeded")
            # FAILED locally or STOPPED by a peer: the stop message decides for the whole job.
            decision = result.message
            if decision.get("final"):
                code = int(decision.get("exit_code", exitcodes.FAILED))
                return self._finish(code, decision.get("reason", "job failed"))
            self.log.emit("restart", round=rnd.index, restart_count=decision.get("restart_count"),
                          max_restarts=cfg.max_restarts)
            self.say(f"restarting workers: {decision.get('reason', '')} "
                     f"(restart {decision.get('restart_count', '?')} of {cfg.max_restarts})")

    # ---- one round ------------------------------------------------------------------------------

    def _run_round(self, rnd: Round) -> RoundResult:
        self._drain_stale_events()
        self._watchers = [StopWatcher(rnd, lambda msg: self._post("peer_stop", msg))]
        self._watchers[0].start()
        try:
            self._workers = self._start_workers(rnd)
            result = self._watch(rnd)
        finally:
            for watcher in self._watchers:
                watcher.cancel()
            self._stop_workers(grace=self.cfg.shutdown_timeout)
        return result

    def _watch(self, rnd: Round) -> RoundResult:
        """Wait for events until this round ends for this node."""
        cfg = self.cfg
        check_membership = cfg.rdzv_backend == "c10d" and not cfg.standalone
        next_membership_check = time.monotonic() + max(cfg.monitor_interval, 0.5)
        local_done = False
        while True:
            timeout = max(0.0, next_membership_check - time.monotonic()) if check_membership else None
            self._wait_events(timeout)
            # 1. reap workers
            for worker in self._workers:
                if worker.alive:
                    worker.reap()
            failed = [w for w in self._workers if w.status is not None and not w.status.ok
                      and not getattr(w, "_recorded", False)]
            if failed and not local_done:
                return self._local_failure(rnd, [self._crash_record(rnd, w) for w in failed])
            # 2. queued events
            while True:
                try:
                    kind, payload = self._events.get_nowait()
                except queue.Empty:
                    break
                result = self._dispatch(rnd, kind, payload, local_done)
                if result is not None:
                    return result
            # 3. local success?
            if not local_done and self._workers and all(w.status is not None and w.status.ok
                                                         for w in self._workers):
                local_done = True
                if self._node_done(rnd):
                    return RoundResult(Outcome.SUCCEEDED)
                self.say("local workers finished; waiting for the other nodes")
            # 4. membership
            if check_membership and time.monotonic() >= next_membership_check:
                next_membership_check = time.monotonic() + max(cfg.monitor_interval, 0.5)
                if not local_done and self._rdzv and self._rdzv.num_nodes_waiting() > 0:
                    message = {"reason": "a node is waiting to join", "origin": self.node, "final": False,
                               "restart_count": rnd.restart_count, "membership": True}
                    publish_stop(rnd, message)
                    return RoundResult(Outcome.STOPPED, message=read_stop(rnd) or message)

    def _dispatch(self, rnd: Round, kind: str, payload: Any, local_done: bool) -> RoundResult | None:
        if kind == "signal":
            return self._handle_signal(rnd, payload)
        if kind == "peer_stop":
            return self._handle_peer_stop(rnd, payload)
        if kind == "monitor" and not local_done:
            return self._handle_monitor_event(rnd, payload)
        if kind == "all_done":
            return RoundResult(Outcome.SUCCEEDED)
        return None

    # ---- handlers -------------------------------------------------------------------------------

    def _handle_signal(self, rnd: Round, signum: int) -> RoundResult:
        name = signal.Signals(signum).name
        assert self.log
        self.log.emit("signal", signal=name)
        cfg = self.cfg
        if name in cfg.preempt_signals:
            forward, grace = signal.Signals[cfg.preempt_forward_signal], cfg.preempt_grace
            self.log.emit("preemption", signal=name, forward=forward.name, grace=grace)
            self.say(f"PREEMPTION ({name}): sending {forward.name} to the workers so they can checkpoint, "
                     f"then stopping them after {grace:g} s")
        else:
            forward, grace = signal.Signals(signum), cfg.shutdown_timeout
            self.say(f"received {name}: forwarding it to the workers, then stopping them (grace {grace:g} s)")
        self._stop_workers(first_signal=forward, grace=grace)
        message = {"reason": f"{name} on node {self.node}", "origin": self.node, "final": True,
                   "exit_code": exitcodes.FAILED}
        try:
            publish_stop(rnd, message)
        except Exception:
            pass  # the store may be gone too; our own exit does not depend on it
        return RoundResult(Outcome.SIGNALED, signum=signum)

    def _handle_peer_stop(self, rnd: Round, message: dict) -> RoundResult:
        assert self.log
        self.log.emit("stop", round=rnd.index, reason=message.get("reason"), origin=message.get("origin"))
        if message.get("origin") != self.node or message.get("group_rank") != rnd.group_rank:
            self.say(f"stopping local workers: {message.get('reason')} (from {message.get('origin')})")
        self._stop_workers(grace=self.cfg.shutdown_timeout)
        return RoundResult(Outcome.STOPPED, message=message)

    def _handle_monitor_event(self, rnd: Round, event: dict) -> RoundResult | None:
        name = event.get("ev")
        assert self.log
        if name == "expired":
            return self._hang(rnd, event)
        if name == "monitor_exit":
            self.log.emit("monitor_lost", round=rnd.index, exit_code=event.get("code"))
            record = FailureRecord(round=rnd.index, rank=-1, local_rank=-1, node=self.node,
                                   group_rank=rnd.group_rank, cause="monitor", status=None,
                                   detail=f"the rank monitor process died (exit {event.get('code')}); "
                                          "hang detection was lost, so the round is restarted")
            return self._local_failure(rnd, [record])
        if name == "workload_request":
            self.log.emit("workload_request", rank=event.get("rank"), action=event.get("action"),
                          description=event.get("description"))
            if event.get("action") == "ShutdownWorkload":
                record = FailureRecord(round=rnd.index, rank=int(event.get("rank", -1)), local_rank=-1,
                                       node=self.node, group_rank=rnd.group_rank, cause="request",
                                       status=None, detail=f"worker asked to shut down the workload: "
                                                           f"{event.get('description')}")
                return self._local_failure(rnd, [record], final=True)
        return None

    def _hang(self, rnd: Round, event: dict) -> RoundResult:
        from . import hangs

        assert self.log
        worker = next((w for w in self._workers if w.local_rank == event.get("local_rank")), None)
        self.log.emit("hang", round=rnd.index, rank=event.get("rank"), local_rank=event.get("local_rank"),
                      pid=event.get("pid"), kind=event.get("kind"), section=event.get("section"),
                      timeout=event.get("timeout"), elapsed=event.get("elapsed"),
                      last_heartbeat_age=event.get("last_heartbeat_age"),
                      open_sections=event.get("open_sections"))
        self.say(f"HANG: rank {event.get('rank')} {hangs.describe(event)}; dumping stacks, then stopping "
                 "the workers")
        dumps = hangs.dump_all(self, rnd)
        record = FailureRecord(round=rnd.index, rank=int(event.get("rank", -1)),
                               local_rank=int(event.get("local_rank", -1)), node=self.node,
                               group_rank=rnd.group_rank, cause="hang", status=None,
                               pid=worker.pid if worker else None, section=event.get("section"),
                               detail=hangs.describe(event))
        hung_dump = next((d for d in dumps if d.get("local_rank") == record.local_rank), None)
        if hung_dump:
            record.stacks, record.stack_summary = hung_dump.get("path"), hung_dump.get("summary")
        self._stop_workers(grace=self.cfg.hang_kill_grace)
        return self._local_failure(rnd, [record])

    def _crash_record(self, rnd: Round, worker: Worker) -> FailureRecord:
        worker._recorded = True  # type: ignore[attr-defined]
        assert worker.status is not None
        error_file = ErrorFile.read(Path(worker.spec.env["TORCHELASTIC_ERROR_FILE"]))
        section = self._last_section(worker.local_rank)
        return FailureRecord(round=rnd.index, rank=worker.rank, local_rank=worker.local_rank, node=self.node,
                             group_rank=rnd.group_rank, cause="crash", status=worker.status, pid=worker.pid,
                             section=section, error_file=error_file)

    def _local_failure(self, rnd: Round, records: list[FailureRecord], *, final: bool = False) -> RoundResult:
        """Record, decide for the whole job (first reporter wins), stop local workers."""
        assert self.log and self._rdzv
        cfg = self.cfg
        for record in records:
            self.summary.failures.append(record)
            self.log.emit("failure", **record.to_event())
            self.say(f"FAILURE: {record.describe()}")
        first = records[0]
        no_restart = first.status is not None and first.status.code in cfg.no_restart_exit_codes
        count = self._rdzv.record_failure(rnd)
        reason = first.describe()
        if no_restart:
            final, reason = True, f"{reason}; exit code {first.status.code} is not restarted"  # type: ignore[union-attr]
        elif count > cfg.max_restarts and not final:
            final = True
            reason = f"{reason}; restart budget exhausted ({cfg.max_restarts} restarts allowed)"
        message = {"reason": reason, "origin": self.node, "group_rank": rnd.group_rank, "final": final,
                   "exit_code": exitcodes.FAILED, "restart_count": count}
        publish_stop(rnd, message)
        decided = read_stop(rnd) or message
        self._stop_workers(grace=cfg.shutdown_timeout)
        # Consequences of the stop (siblings killed by us) are not failures of their own.
        for worker in self._workers:
            worker._recorded = True  # type: ignore[attr-defined]
        return RoundResult(Outcome.FAILED, failures=records, message=decided)

    def _node_done(self, rnd: Round) -> bool:
        """Mark this node done; True when every node of the round is done."""
        done = int(rnd.control.add("done_count", 1))
        if done >= rnd.group_world_size:
            rnd.control.set("all_done", "1")
            return True
        watcher = StopWatcher(rnd, lambda _msg: self._post("all_done", None), key="all_done")
        self._watchers.append(watcher)
        watcher.start()
        return False

    # ---- workers --------------------------------------------------------------------------------

    def _start_workers(self, rnd: Round) -> list[Worker]:
        from .worker_env import worker_env

        cfg = self.cfg
        assert self.run_dir and self.log
        attempt_dir = self.run_dir / f"attempt_{rnd.index}"
        workers = []
        sockets = {}
        if self._monitor:
            for local_rank in range(cfg.nproc_per_node):
                sockets[local_rank] = str(self.sock_dir / f"rmon{local_rank}.sock")  # type: ignore[operator]
                self._monitor.arm(local_rank=local_rank, rank=rnd.rank_offset + local_rank,
                                  socket=sockets[local_rank])
        for local_rank in range(cfg.nproc_per_node):
            rank_dir = attempt_dir / str(local_rank)
            rank_dir.mkdir(parents=True, exist_ok=True)
            env = worker_env(cfg, rnd, local_rank, self.environ, error_file=rank_dir / "error.json",
                             stack_file=rank_dir / "stacks.faulthandler.txt",
                             monitor_socket=sockets.get(local_rank),
                             launcher_socket=self._monitor.launcher_socket if self._monitor else None)
            argv = [a.replace("${local_rank}", str(local_rank)) for a in
                    (*cfg.entrypoint, *cfg.training_script_args)]
            spec = WorkerSpec(local_rank=local_rank, rank=rnd.rank_offset + local_rank, argv=argv, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            worker = spawn(spec)
            worker.pumps = self._pumps(worker, rank_dir)
            if self._monitor:
                self._monitor.set_pid(local_rank=local_rank, pid=worker.pid)
            self.log.emit("worker_start", rank=spec.rank, local_rank=local_rank, pid=worker.pid, round=rnd.index)
            workers.append(worker)
        self.say(f"started {len(workers)} workers, ranks {rnd.rank_offset}-{rnd.rank_offset + len(workers) - 1} "
                 f"of {rnd.world_size} (round {rnd.index}, restart {rnd.restart_count}, "
                 f"master {rnd.master_addr}:{rnd.master_port})")
        return workers

    def _pumps(self, worker: Worker, rank_dir: Path) -> list:
        cfg = self.cfg
        lr = worker.local_rank
        show = cfg.local_ranks_filter is None or lr in cfg.local_ranks_filter
        pumps = []
        for bit, stream, name, console, filters in (
            (1, worker.proc.stdout, "stdout", sys.stdout.buffer, cfg.duplicate_stdout_filters),
            (2, worker.proc.stderr, "stderr", sys.stderr.buffer, cfg.duplicate_stderr_filters),
        ):
            redirected = bool(cfg.redirects.for_rank(lr) & bit)
            teed = bool(cfg.tee.for_rank(lr) & bit)
            logfile = rank_dir / f"{name}.log" if (redirected or teed) else None
            to_console = console if show and (teed or not redirected) else None
            filtered = None
            if filters:
                filtered = self._filtered_file(name)
            pump = OutputPump(stream, prefix=f"[rank{worker.rank}]:".encode(), console=to_console,
                              logfile=logfile, filters=filters, filtered=filtered)
            pumps.append(pump.start())
        return pumps

    def _filtered_file(self, name: str):
        assert self.run_dir
        attr = f"_filtered_{name}"
        if not hasattr(self, attr):
            setattr(self, attr, open(self.run_dir / f"filtered_{name}.log", "ab"))
        return getattr(self, attr)

    def _stop_workers(self, *, first_signal: int = signal.SIGTERM, grace: float = 30.0) -> None:
        if not self._workers:
            return
        if self._monitor:
            for worker in self._workers:
                try:
                    self._monitor.disarm(worker.local_rank)
                except Exception:
                    pass
        stop_all(self._workers, first_signal=first_signal, grace=grace,
                 on_escalate=lambda w: self.say(f"rank {w.rank} did not stop within {grace:.0f} s: SIGKILL"))
        assert self.log and self._round
        for worker in self._workers:
            if not getattr(worker, "_exit_logged", False) and worker.status is not None:
                worker._exit_logged = True  # type: ignore[attr-defined]
                self.log.emit("worker_exit", rank=worker.rank, local_rank=worker.local_rank, pid=worker.pid,
                              round=self._round.index, exit_code=worker.status.code, signal=worker.status.signal,
                              seconds=round((worker.ended or time.monotonic()) - worker.started, 3))

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

    def _start_monitor(self) -> None:
        if not self.cfg.rank_monitor:
            return
        from .monitor_link import MonitorLink

        env = dict(self.environ)
        self._monitor = MonitorLink(lambda ev: self._post("monitor", ev), env=env)
        assert self.sock_dir
        self._monitor.start(self.sock_dir, self.cfg.ft.as_nvrx_dict())

    # ---- events, signals, plumbing --------------------------------------------------------------

    def _post(self, kind: str, payload: Any) -> None:
        """Thread-safe: queue an event and wake the loop."""
        self._events.put((kind, payload))
        try:
            os.write(self._wake_w, b"\0")
        except OSError:
            pass

    def _wait_events(self, timeout: float | None) -> None:
        fds = [self._wake_r] + [w.pidfd for w in self._workers if w.alive]
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
            self._post("monitor", {"ev": "monitor_exit", "code": code})

    def _drain_stale_events(self) -> None:
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

        for name in dict.fromkeys((*self.cfg.signals_to_handle, *self.cfg.preempt_signals)):
            sig = signal.Signals[name]
            old[sig] = signal.signal(sig, handler)
        return old

    def _prepare_dirs(self) -> None:
        cfg = self.cfg
        base = Path(cfg.log_dir) if cfg.log_dir else Path(tempfile.gettempdir()) / "mbr-launch"
        base.mkdir(parents=True, exist_ok=True)
        self.run_dir = base / f"{cfg.run_id}_{uuid.uuid4().hex[:6]}_{self.node}"
        self.run_dir.mkdir(parents=True)
        # Sockets live in a private directory (0700), never directly in the shared temp dir.
        self.sock_dir = Path(tempfile.mkdtemp(prefix="mbr-"))
        self.log = EventLog(self.run_dir / "events.jsonl", node=self.node)
        slurm = cfg.slurm
        self.log.emit("start", argv=sys.argv, run_id=cfg.run_id, nproc_per_node=cfg.nproc_per_node,
                      nnodes=f"{cfg.min_nodes}:{cfg.max_nodes}", max_restarts=cfg.max_restarts,
                      log_dir=str(self.run_dir),
                      slurm={"job": slurm.job_id, "step": slurm.step_id, "node": slurm.hostname,
                             "restart_count": slurm.restart_count} if slurm else None)
        for warning in cfg.warnings:
            self.say(f"WARNING: {warning}")

    def _teardown(self, old_handlers: dict[int, Any]) -> None:
        try:
            self._stop_workers(grace=self.cfg.shutdown_timeout)
        except Exception:
            pass
        # A thread blocked inside a torch store call at interpreter exit aborts the process.
        for watcher in self._watchers:
            watcher.cancel()
        for watcher in self._watchers:
            watcher.join(StopWatcher.POLL + 1.0)
        if self._monitor:
            self._monitor.close()
        if self._rdzv:
            self._rdzv.shutdown()
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

    def _finish_signaled(self, signum: int, rnd: Round | None) -> int:
        name = signal.Signals(signum).name
        if name not in self.cfg.preempt_signals:
            return self._finish(128 + signum, f"launcher received {name}")
        from .preemption import maybe_requeue

        requeued = maybe_requeue(self.cfg, rnd.group_rank if rnd else self.cfg.node_rank, self.say)
        if self.log and requeued is not None:
            self.log.emit("requeue", job=self.cfg.slurm.job_id if self.cfg.slurm else None, ok=requeued)
        return self._finish(exitcodes.PREEMPTED, f"preempted by {name}" + (" (job requeued)" if requeued else ""))

    def _finish(self, code: int, reason: str) -> int:
        self.summary.exit_code, self.summary.reason = code, reason
        assert self.log
        self.log.emit("end", exit_code=code, reason=reason, seconds=round(time.monotonic() - self._t0, 3))
        text = self.summary.render()
        if text:
            print(text, file=sys.stderr, flush=True)
        self.say(f"done: {reason} (exit code {code}); logs and events in {self.run_dir}")
        return code

    def say(self, message: str) -> None:
        if not self.cfg.quiet or message.startswith(("FAILURE", "HANG")):
            print(f"[mbr-launch {self.node}] {message}", file=sys.stderr, flush=True)


def json_dumps(data: Any) -> str:
    return json.dumps(data, default=str)


__all__ = ["Agent", "ExitStatus", "wait_any"]
