"""The agent's life around the supervisor loop: set up (run folder, event log, worker group and its
standbys, rank monitor, signal handlers, store guard), run the loop, and tear everything down so that
nothing of ours outlives the launcher. ``MonitorHandle``: the rank monitor process as the agent holds it."""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable

from mbr_launch import nofile, outside
from mbr_launch.agent import leaving, progress
from mbr_launch.agent.context import Context, Feature
from mbr_launch.agent.features import build_features, monitor_settings
from mbr_launch.agent.loop import Supervisor
from mbr_launch.agent.messages import Departure, Event, decode_monitor_event
from mbr_launch.agent.wakeup import StuckSignals, Wakeup
from mbr_launch.agent.watch import StoreCluster
from mbr_launch.cluster.rendezvous import Rendezvous
from mbr_launch.cluster.round import Round
from mbr_launch.cluster import stops, torch_internals
from mbr_launch.cluster.peers import own_time, store_host_alive
from mbr_launch.cluster.storeguard import StoreGuard
from mbr_launch.cluster.storevalue import Sealer
from mbr_launch.config.model import LaunchConfig
from mbr_launch.config.rundir import make_run_dir, make_socket_dir
from mbr_launch.monitor.link import MonitorLink
from mbr_launch.report import exitcodes, runs
from mbr_launch.report.console import process_console
from mbr_launch.report.events import EventLog
from mbr_launch.report.redact import redact_argv
from mbr_launch.report.version import versions
from mbr_launch.workers import numa, strays
from mbr_launch.workers.group import WorkerGroup, longest_socket_name
from mbr_launch.workers.standbypool import StandbyPool

SPARE_LINGER = 3.0  # seconds the store's host serves on after closing, so spares read "closed", not "gone"
# After a successful job the store's host waits for farewells until none came for FAREWELL_QUIET s (CAP in all).
FAREWELL_QUIET, FAREWELL_CAP = 5.0, 60.0
PART_BOUND = 5.0  # seconds for this node's own farewell (one store call)


class MonitorHandle:
    def __init__(self, *, enabled: bool, sock_dir: Path, ft: dict[str, Any], steps: dict[str, Any] | None,
                 env: dict[str, str], post: Callable[[Event], None],
                 on_link: Callable[[MonitorLink | None], None], early: MonitorLink | None = None) -> None:
        self._enabled = enabled
        self._early = early  # the monitor's process, spawned by the launcher before it imported torch
        self._sock_dir, self._ft, self._env = sock_dir, ft, env
        self.steps = steps  # step deadlines and status rows, as the features asked (``agent.features``)
        self._post = post
        self._on_link = on_link  # the worker group arms its ranks through the current link
        self.link: MonitorLink | None = None

    def start(self) -> None:
        if not self._enabled:
            return
        link, self._early = self._early, None
        self.link = link or MonitorLink(env=dict(self._env))
        self.link.on_event = self._on_raw
        self.link.start(self._sock_dir, self._ft, steps=self.steps)
        self._on_link(self.link)

    restart = start  # after the monitor died (``reap``)

    def _on_raw(self, raw: dict[str, Any]) -> None:
        event = decode_monitor_event(raw)
        if event is not None:
            self._post(event)

    @property
    def pidfd(self) -> int | None:
        return self.link.pidfd if self.link else None

    def reap(self) -> int | None:
        """The monitor exited (its pidfd is readable): forget it; its exit code."""
        assert self.link is not None
        code = self.link.exit_code()
        if self.link.pidfd is not None:
            os.close(self.link.pidfd)
            self.link.pidfd = None
        self.link = None
        self._on_link(None)
        return code

    def pending_signals(self) -> frozenset[int] | None:
        """The job's signals sent to the monitor's process too (``monitor.witness``); None without a monitor."""
        return self.link.pending_signals() if self.link else None

    def snapshot(self) -> dict[str, Any] | None:
        return self.link.snapshot(timeout=1.0) if self.link else None

    def rows(self) -> list[Any]:
        """The monitor's per-rank rows from one snapshot; none when it does not answer."""
        try:
            return (self.snapshot() or {}).get("ranks", [])
        except Exception:  # the monitor's view is a bonus: none is no rows
            return []

    def last_sections(self, local_ranks: Iterable[int]) -> dict[int, str | None]:
        """Each rank's open sections ("a,b"; None: none, or no answer), from one snapshot."""
        wanted = dict.fromkeys(local_ranks)
        for entry in self.rows():
            local_rank = entry.get("local_rank")
            if local_rank in wanted and entry.get("open_sections"):
                wanted[local_rank] = ",".join(entry["open_sections"])
        return wanted

    def ages(self, local_ranks: Iterable[int]) -> dict[int, float]:
        """Seconds since each rank's last heartbeat or step, from one snapshot; unknown ones left out."""
        wanted, out = set(local_ranks), {}
        for entry in self.rows():
            ages = [a for a in (outside.finite(entry.get("last_heartbeat_age"), 0.0),
                                outside.finite(entry.get("last_step_age"), 0.0)) if a is not None]
            if entry.get("local_rank") in wanted and ages:
                out[entry["local_rank"]] = min(ages)
        return out

    def close(self, timeout: float = 5.0) -> None:
        for link in (self.link, self._early):
            if link:
                link.close(timeout=timeout)


class Agent:
    def __init__(self, cfg: LaunchConfig, *, environ: dict[str, str] | None = None,
                 standby: StandbyPool | None = None, monitor: MonitorLink | None = None, exit_after: bool = False,
                 clock: Callable[[], float] = time.monotonic, sealer: Sealer | None = None) -> None:
        self.cfg = cfg
        self._sealer = sealer  # the job's secret, or none (api.launch reads it): the rendezvous owns it
        self._exit_after = exit_after  # the process ends (os._exit) as soon as run() returns
        self._early_standby = standby  # a StandbyPool the launcher started before importing torch
        self._early_monitor = monitor  # the rank monitor's process, spawned then too (MonitorLink.spawn)
        self.environ = dict(os.environ if environ is None else environ)
        self.node = socket.gethostname()
        self.clock = clock
        self._started = clock()
        self.ctx: Context | None = None
        self._group: WorkerGroup | None = None
        self._monitor: MonitorHandle | None = None
        self._cluster: StoreCluster | None = None
        self._rendezvous: Rendezvous | None = None
        self._log: EventLog | None = None
        self._sock_dir: Path | None = None
        self._features: list[Feature] = []
        self._guard: StoreGuard | None = None

    def run(self) -> int:
        # Orphaned descendants of the workers become ours, not init's: a stop finds and kills them.
        strays.become_subreaper()
        wakeup = Wakeup(self.clock)
        old_handlers = self._install_signals(wakeup)
        guard = self._guard = StoreGuard(self._store_hung, clock=own_time, alive=self._store_host_alive)
        stuck = StuckSignals(old_handlers, lambda: wakeup.received, self._signal_unseen, blocked_in=guard.blocked_in,
                             nudge=wakeup.nudge).start()
        guard.start()
        try:
            self.ctx = self._assemble(wakeup, guard)
            return Supervisor(self.ctx).run()
        finally:
            self._teardown(guard, wakeup, old_handlers, stuck)

    # ---- set up ---------------------------------------------------------------------------------

    def _assemble(self, wakeup: Wakeup, guard: StoreGuard) -> Context:
        cfg = self.cfg
        run_dir = make_run_dir(cfg.output.log_dir, cfg.rendezvous.run_id, self.node,  # private, 0700
                               keep_runs=cfg.output.keep_runs)
        # Sockets live in a private directory (0700), never directly in the shared temp dir.
        self._sock_dir = make_socket_dir(longest_socket_name(cfg.workers.nproc_per_node))
        log = self._log = EventLog(run_dir / runs.LOG, node=self.node, warn=self.say)
        group = self._group = WorkerGroup(cfg, environ=self.environ, run_dir=run_dir, sock_dir=self._sock_dir,
                                          log=log, monitor=None, say=self.say)
        # A stop's grace: its progress, and a second Ctrl-C that ends it.
        group.watch_stop = functools.partial(progress.StopProgress, wakeup, self.say, preemption=cfg.preemption.signals)
        slurm = cfg.slurm
        internals = torch_internals.status() if cfg.rendezvous.backend == "c10d" else None
        # The command line without secrets; the environment is never written.
        log.emit("start", argv=redact_argv(sys.argv), run_id=cfg.rendezvous.run_id,
                 nproc_per_node=cfg.workers.nproc_per_node,
                 nnodes=f"{cfg.rendezvous.min_nodes}:{cfg.rendezvous.max_nodes}", max_restarts=cfg.policy.max_restarts, log_dir=str(run_dir),
                 slurm={"job": slurm.job_id, "step": slurm.step_id, "node": slurm.hostname,
                        "restart_count": slurm.restart_count} if slurm else None, version=versions(),
                 standby={"level": cfg.standby.level, "why": cfg.standby.why},
                 torch_internals=None if internals is None else torch_internals.not_installed(internals),
                 nofile=None if nofile.raised is None else {"soft_was": nofile.raised[0], "soft": nofile.raised[1]})
        for warning in cfg.warnings:
            self.say(f"WARNING: {warning}")
        if lost := torch_internals.lost_line(internals or ()):
            self.say(f"WARNING: {lost}")
        binding = numa.for_launch(self.environ, nproc_per_node=cfg.workers.nproc_per_node,
                                  strict=cfg.nvrx.numa_bind_strict).line
        if binding:
            self.say(binding)
        rendezvous = self._rendezvous = Rendezvous(cfg, self._sealer)
        # min-healthy (as in ft_launcher) admits late nodes at the next restart, not by stopping the ranks at work
        elastic = cfg.rendezvous.backend == "c10d" and not cfg.rendezvous.standalone and not cfg.policy.min_healthy
        cluster = self._cluster = StoreCluster(rendezvous, peer_timeout=cfg.rendezvous.peer_timeout, membership=elastic)
        # The features tell the monitor what to send, so they come first; they read its view once it runs.
        features = self._features = build_features(
            cfg, log=log, say=self.say, node=self.node, environ=self.environ, rendezvous=rendezvous,
            hosts_store=cluster.hosts_store, snapshot=lambda: monitor.snapshot(), own_pids=group.own_pids,
            clock=self.clock)
        monitor = self._monitor = MonitorHandle(
            enabled=cfg.monitor.enabled, sock_dir=self._sock_dir, ft=cfg.ft.as_nvrx_dict(),
            steps=monitor_settings(features), env=self.environ, post=wakeup.post,
            on_link=lambda link: setattr(group, "monitor", link), early=self._early_monitor)
        group.start_standbys(self._early_standby)  # warm workers prepare while the rendezvous runs
        monitor.start()
        return Context(cfg=cfg, node=self.node, log=log, say=self.say, group=group, rendezvous=rendezvous,
                       cluster=cluster, monitor=monitor, wakeup=wakeup, guard=guard, clock=self.clock,
                       run_dir=run_dir, started=self._started, features=features)

    def _install_signals(self, wakeup: Wakeup) -> dict[int, Any]:
        old = {}

        def handler(signum: int, _frame: Any) -> None:
            wakeup.post_signal(signum)  # only record it: no logging or I/O here (the logging lock can deadlock)

        for name in dict.fromkeys((*self.cfg.workers.signals_to_handle, *self.cfg.preemption.signals)):
            sig = signal.Signals[name]
            old[sig] = signal.signal(sig, handler)
        return old

    # ---- tear down ------------------------------------------------------------------------------

    def _teardown(self, guard: StoreGuard, wakeup: Wakeup, old_handlers: dict[int, Any], stuck: StuckSignals) -> None:
        rnd = self.ctx.round if self.ctx else None
        if self._group:
            with contextlib.suppress(Exception):
                self._group.stop(rnd, grace=self.cfg.workers.shutdown_timeout)
            self._group.close()
        if self._early_standby and (self._group is None or self._group.standby is not self._early_standby):
            self._early_standby.close()  # set-up failed before the group adopted it
        for feature in self._features:
            feature.close()
        if self._cluster:
            self._cluster.close(join=not self._exit_after)
        if self._monitor:
            self._monitor.close()
        elif self._early_monitor:
            self._early_monitor.close()  # set-up failed before the monitor handle took it
        self._part_from_rendezvous(rnd, wakeup)
        guard.close()
        stuck.close()
        for sig, old in old_handlers.items():
            signal.signal(sig, old)
        wakeup.close()
        if self._sock_dir:
            for item in self._sock_dir.iterdir():
                item.unlink(missing_ok=True)
            self._sock_dir.rmdir()
        if self._log:
            self._log.close()

    def _part_from_rendezvous(self, rnd: Round | None, wakeup: Wakeup) -> None:
        departure = self.ctx.departure if self.ctx else Departure.CLOSE
        if self._rendezvous is None or departure is Departure.NONE:
            return
        bound = PART_BOUND
        if departure is Departure.LEAVE:  # leave the rendezvous without closing it for the others
            ctx, rendezvous = self.ctx, self._rendezvous
            assert ctx is not None  # only the loop decides that this node leaves

            def part() -> None:
                leaving.leave_failed(ctx, rendezvous.leave())
        else:
            hosting = rnd is not None and self._cluster is not None and self._cluster.hosts_store(rnd)
            succeeded = rnd is not None and self.ctx is not None and self.ctx.summary.exit_code == exitcodes.OK
            part = functools.partial(self._close_rendezvous, rnd if succeeded else None, hosting)
            if hosting and succeeded:
                bound += FAREWELL_CAP
        # Bounded: on a dead link these calls would never return.
        farewell = threading.Thread(target=part, name="rdzv-farewell", daemon=True)
        farewell.start()
        progress.farewell(wakeup, farewell, bound)  # a Ctrl-C now ends the wait

    def _close_rendezvous(self, done: Round | None, hosting: bool) -> None:
        """After a successful job (``done``) the store's host waits for every node's farewell before closing."""
        if done is not None:
            with contextlib.suppress(Exception):  # the store is gone already: nothing to wait for
                stops.farewell(done)
                if hosting:
                    stops.await_farewells(done, FAREWELL_QUIET, FAREWELL_CAP)
        assert self._rendezvous is not None
        self._rendezvous.shutdown(linger=SPARE_LINGER if hosting else 0.0)

    def _store_host_alive(self) -> bool:
        """Watchdog thread: whether the store's host runs here, alive (then a blocked call is slow, not cut)."""
        rnd = self.ctx.round if self.ctx is not None else None
        return rnd is not None and store_host_alive(rnd)

    def _store_hung(self, what: str, seconds: float) -> None:
        """Watchdog thread: a store call has blocked past its bound (a cut link). Stop everything, exit 3."""
        reason = (f"lost the rendezvous store: {what} blocked for {seconds:.0f} s (this node may be cut off "
                  f"from {self.cfg.rendezvous.endpoint})")
        self._end_from_watchdog(exitcodes.RENDEZVOUS, reason, f"LOST THE RENDEZVOUS STORE: {reason}")

    def _signal_unseen(self, signum: int) -> None:
        """Watchdog thread: a signal came while the main thread is stuck in C code. Stop everything from here."""
        name = signal.Signals(signum).name
        preempted = name in self.cfg.preemption.signals
        code = exitcodes.PREEMPTED if preempted else 128 + signum
        call = self._guard.blocked_in() if self._guard else None
        where = f"while blocked in a store call ({call})" if call else "while the main thread was blocked in C code"
        reason = f"{'preempted by' if preempted else 'launcher received'} {name} ({where})"
        if self._log:
            self._log.emit("signal", signal=name)
        self._end_from_watchdog(code, reason, f"received {name} {where}: stopping now")

    def _end_from_watchdog(self, code: int, reason: str, line: str) -> None:
        if self._group:
            self._group.kill_now()
        process_console().say(f"[mbr-launch {self.node}] {line}")
        try:
            if self._log:
                self._log.emit("end", exit_code=code, reason=reason, seconds=round(self.clock() - self._started, 3))
                self._log.close()
            if self._monitor:
                self._monitor.close(timeout=2)
        finally:
            os._exit(code)

    def say(self, message: str) -> None:
        if not self.cfg.output.quiet or message.startswith(("FAILURE", "HANG", "LOST", "PREEMPTION", "WARNING")):
            process_console().say(f"[mbr-launch {self.node}] {message}")
