"""This node's worker group: start (or restart) local ranks, route their output, stop them, log exits."""

from __future__ import annotations

import errno
import functools
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

from mbr_launch.cluster import workerstore
from mbr_launch.cluster.round import Round
from mbr_launch.config.model import LaunchConfig
from mbr_launch.contract import STACK_FILE_ENV
from mbr_launch.decide.policy import restart_possible
from mbr_launch.report.appender import LineAppender, describe
from mbr_launch.report.console import Console, process_console
from mbr_launch.report.events import EventLog
from mbr_launch.report.private import make_dir
from mbr_launch.workers.standbypool import StandbyPool, early_pool, first_assignment, replenish_delay, standby_env
from mbr_launch.workers.env import worker_env
from mbr_launch.workers.flightrec import TRIGGER_NAME, make_trigger
from mbr_launch.workers.cyclelog import CycleLogs
from mbr_launch.workers.output import OutputPump, rank_prefix
from mbr_launch.workers import killcause, numa, strays
from mbr_launch.workers.process import StopWatch, Worker, WorkerSpec, signal_group, spawn, stop_all, write_rank_map


# The rank monitor's sockets of one local rank, in the agent's socket folder (the monitor adds launcher.sock).
MONITOR_SOCKET = "rmon{}.sock"
STEPS_SOCKET = "steps{}.sock"


def longest_socket_name(nproc_per_node: int) -> str:
    """The longest file name in the socket folder, for a check that every socket path fits."""
    last = nproc_per_node - 1
    return max(MONITOR_SOCKET.format(last), STEPS_SOCKET.format(last), "launcher.sock", key=len)


def drop_empty_stack_file(worker: Worker) -> None:
    """Remove the ended worker's faulthandler stack file when empty: ``boot`` opens one for every rank, and it
    is read only while the worker lives."""
    path = worker.spec.env.get(STACK_FILE_ENV)
    if not path:
        return
    try:
        if os.lstat(path).st_size == 0:
            os.unlink(path)
    except OSError:
        pass  # not made (a full disk), or gone already


class RankArming(Protocol):
    """The rank monitor as the group uses it (``monitor.link.MonitorLink``, a layer above)."""

    launcher_socket: str | None

    @property
    def pid(self) -> int | None: ...
    def arm(self, *, local_rank: int, rank: int, socket: str, step_socket: str | None = None) -> None: ...
    def confirm_armed(self) -> None: ...
    def set_pid(self, *, local_rank: int, pid: int) -> None: ...
    def disarm(self, local_rank: int) -> None: ...


class WorkerGroup:
    def __init__(self, cfg: LaunchConfig, *, environ: dict[str, str], run_dir: Path, sock_dir: Path,
                 log: EventLog, monitor: RankArming | None, say: Callable[[str], None],
                 console: Console | None = None) -> None:
        self.cfg = cfg
        self.console = console or process_console()  # worker output shares the terminal with the live view
        # ${hostname} of --log-line-prefix-template: the short name, as torch 2.14 gives it
        self._hostname = socket.gethostname() if cfg.output.line_prefix_template else ""
        self.environ = environ
        self.run_dir = run_dir
        self.sock_dir = sock_dir
        self.log = log
        self.monitor = monitor  # the current MonitorLink (the agent's ``on_link`` replaces it), or None
        self.say = say
        self.workers: list[Worker] = []
        self._filtered: dict[str, LineAppender] = {}
        # ft_launcher 0.6+'s per-cycle application logs, besides the run folder's (--ft-per-cycle-applog-prefix)
        prefix = cfg.nvrx.per_cycle_applog_prefix
        self.cycle_logs = CycleLogs(prefix, say) if prefix else None
        self._loss_lock = threading.Lock()
        self._warned = False  # the one warning about worker logs that cannot be written
        self.standby: StandbyPool | None = None
        self._envs: dict[int, dict[str, str]] = {}  # the latest environment of each local rank
        self.watch_stop: Callable[[float], StopWatch] | None = None  # grace -> a watch for one stop (the agent's)
        self._store: Any = None  # this round's workers' store, when this agent serves it (group rank 0)
        self._agent_store = False  # whether the workers find their store served (TORCHELASTIC_USE_AGENT_STORE)
        # Told the workers a stop is about to signal (``features.health.GpuGate`` notes what they hold on the GPUs then).
        self.before_stop: Callable[[Sequence[Worker]], None] | None = None
        self._kills = killcause.Ledger()  # who sent the signal a worker died of

    def start_standbys(self, pool: StandbyPool | None = None) -> None:
        """Adopt ``pool`` (started early) or start one standby per local rank; call before the first round."""
        self.standby = pool or early_pool(self.cfg, self.environ)
        if self.standby:
            self.standby.prepare = self._standby  # refills know the latest real environment

    def _standby(self, local_rank: int) -> tuple[list[str], dict[str, str]] | None:
        env = self._envs.get(local_rank)
        if env is None:  # before the first round: the round's values are filled in when it is taken
            return first_assignment(self.cfg, self.environ, local_rank)
        return numa.worker_argv(self.cfg, self.environ, local_rank), standby_env(env)

    # ---- start ----------------------------------------------------------------------------------

    def start(self, rnd: Round, local_ranks: list[int] | None = None, *, restart_count: int | None = None) -> None:
        """Start ``local_ranks`` (default: all) for ``rnd``; a restarted rank replaces its old entry."""
        ranks = list(range(self.cfg.workers.nproc_per_node)) if local_ranks is None else local_ranks
        count = rnd.restart_count if restart_count is None else restart_count
        if local_ranks is None:  # a new round: a new, empty store for its workers (the old one closes)
            self._store = None
            # a static rendezvous's store serves the workers (cluster.workerstore), cleared for each round
            serve = rnd.group_rank == 0 and not rnd.shared_store
            self._store = workerstore.serve(rnd.master_addr, rnd.master_port) if serve else None
            self._agent_store = not serve or self._store is not None
        for local_rank in ranks:
            worker = self._spawn(rnd, local_rank, count)
            self.workers = [w for w in self.workers if w.local_rank != local_rank] + [worker]
        self.workers.sort(key=lambda w: w.local_rank)
        write_rank_map(self.run_dir, round_index=rnd.index, restart_count=count, world_size=rnd.world_size,
                       workers=self.workers)
        # Replacements prepare in the background once these ranks are under way, while a restart may use them.
        if self.standby and restart_possible(self.cfg.policy, restarts_used=count, elastic=self.cfg.rendezvous.elastic):
            self.standby.starting()
            self.standby.fill(ranks, delay=replenish_delay(self.cfg.workers.nproc_per_node), background=True)

    def _spawn(self, rnd: Round, local_rank: int, restart_count: int) -> Worker:
        cfg = self.cfg
        rank = rnd.rank_offset + local_rank
        rank_dir = self.run_dir / f"attempt_{rnd.index}" / str(local_rank)
        if restart_count != rnd.restart_count:  # a rank/node-scope restart inside the round
            rank_dir = self.run_dir / f"attempt_{rnd.index}.{restart_count}" / str(local_rank)
        self._make_rank_dir(rank_dir)
        sock = beats = None
        if self.monitor:
            sock = str(self.sock_dir / MONITOR_SOCKET.format(local_rank))
            if cfg.workers.use_boot and cfg.telemetry.autobeat:
                beats = str(self.sock_dir / STEPS_SOCKET.format(local_rank))
            self.monitor.arm(local_rank=local_rank, rank=rank, socket=sock, step_socket=beats)
        env = worker_env(cfg, rnd, local_rank, self.environ, error_file=rank_dir / "error.json",
                         stack_file=rank_dir / "stacks.faulthandler.txt", monitor_socket=sock,
                         launcher_socket=self.monitor.launcher_socket if self.monitor else None,
                         restart_count=restart_count, autobeat_socket=beats,
                         flight_dir=rank_dir if cfg.workers.use_boot else None, agent_store=self._agent_store)
        if cfg.workers.use_boot:
            try:
                make_trigger(rank_dir / TRIGGER_NAME)  # boot opens it at start: it must exist before the worker
            except OSError:
                pass  # a full disk: the worker runs without a Flight Recorder trigger
        spec = WorkerSpec(local_rank=local_rank, rank=rank, argv=numa.worker_argv(cfg, self.environ, local_rank),
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self._envs[local_rank] = env
        worker = self.standby.take(spec) if self.standby else None
        if worker is None:
            worker = spawn(spec)
        self._kills.started(worker.pid)
        worker.pumps = self._pumps(worker, rank_dir, cycle=(restart_count, rnd.world_size))
        if self.monitor:
            self.monitor.confirm_armed()
            self.monitor.set_pid(local_rank=local_rank, pid=worker.pid)
        warm = {"standby_age": worker.standby_age, "standby_state": worker.standby_state} \
            if worker.standby_age is not None else \
            {"standby_miss": self.standby.last_miss} if self.standby else {}
        self.log.emit("worker_start", rank=rank, local_rank=local_rank, pid=worker.pid, round=rnd.index,
                      restart_count=restart_count, standby=worker.standby_age is not None, **warm)
        return worker

    def _make_rank_dir(self, rank_dir: Path) -> None:
        """``attempt_N/L`` (0700); on a full disk the worker starts anyway (its lost logs are counted)."""
        try:
            make_dir(rank_dir.parent)
            make_dir(rank_dir)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EPERM, errno.ENOTDIR):
                raise  # a folder swapped for a symlink or someone else's: never write through it
            self._warn_once(rank_dir, exc)

    def _pumps(self, worker: Worker, rank_dir: Path, *, cycle: tuple[int, int] = (0, 1)) -> list:
        """The worker's two pumps; ``cycle``: (its TORCHELASTIC_RESTART_COUNT, world size), for the per-cycle log."""
        out = self.cfg.output
        lr = worker.local_rank
        show = out.local_ranks_filter is None or lr in out.local_ranks_filter
        pumps = []
        for bit, stream, name, filters in (
            (1, worker.proc.stdout, "stdout", out.duplicate_stdout_filters),
            (2, worker.proc.stderr, "stderr", out.duplicate_stderr_filters),
        ):
            redirected = bool(out.redirects.for_rank(lr) & bit)
            teed = bool(out.tee.for_rank(lr) & bit)
            logfile = rank_dir / f"{name}.log" if (redirected or teed) else None
            prefix = rank_prefix(out.line_prefix_template, rank=worker.rank, local_rank=lr, role=self.cfg.workers.role,
                                 hostname=self._hostname)
            console = self.console.source(name, prefix) if show else None
            to_console = console if teed or not redirected else None
            filtered = self._filtered_file(name) if filters else None
            pump = OutputPump(stream, prefix=prefix, console=to_console,
                              logfile=logfile, filters=filters, filtered=filtered,
                              tail=worker.tail if name == "stderr" else None, fallback=console,
                              on_log_failure=lambda _pump, log: self._warn_once(log.path, log.error),
                              mirror=self.cycle_logs.sink(cycle[0], worker.rank, cycle[1]) if self.cycle_logs else None,
                              on_done=functools.partial(self._pump_done, worker, name))
            pumps.append(pump.start())
        return pumps

    def _filtered_file(self, name: str) -> LineAppender:
        if name not in self._filtered:
            self._filtered[name] = LineAppender(self.run_dir / f"filtered_{name}.log")
        return self._filtered[name]

    def _warn_once(self, path: Path, error: OSError | None) -> None:
        """One warning for the whole group: a full disk fails every log at once."""
        with self._loss_lock:
            if self._warned:
                return
            self._warned = True
        self.say(f"WARNING: cannot write worker output to {path}: {describe(error)}; the job goes on, its "
                 "output goes on to the console, and what the log files miss is counted in events.jsonl "
                 "(output_lost)")

    def _pump_done(self, worker: Worker, stream: str, pump: OutputPump) -> None:
        log = pump.log
        if log is None or not log.lost_lines:
            return
        self.log.emit("output_lost", rank=worker.rank, local_rank=worker.local_rank, stream=stream,
                      path=str(log.path), error=describe(log.error), lost_bytes=log.lost_bytes,
                      lost_lines=log.lost_lines)

    def training(self) -> None:
        """Every local rank is past its start-up: replacement standbys may have the normal priority soon."""
        if self.standby:
            self.standby.training()

    # ---- watch ----------------------------------------------------------------------------------

    def reap(self, rnd: Round) -> list[Worker]:
        """Workers that ended since the last call (each reported once)."""
        if self.standby:  # every turn of the agent's loop comes here: standbys due for their priority get it
            self.standby.promote()
        ended = []
        for worker in self.workers:
            if worker.alive:
                worker.reap()
            if worker.status is not None and not worker.noticed:
                worker.noticed = True
                self._explain(worker)
                self._log_exit(rnd, worker)
                ended.append(worker)
        return ended

    def last_lines(self, worker: Worker, *, wait: float = 0.3) -> list[str]:
        """The last lines the worker wrote to stderr; after its exit, waits briefly for the pump to drain."""
        for pump in worker.pumps[1:]:  # (stdout, stderr): only stderr's lines are kept
            pump.join(wait)
        return [line.decode(errors="replace").rstrip("\n") for line in list(worker.tail)]

    def settle_output(self, *, timeout: float) -> None:
        """Wait (at most ``timeout`` s in all) for the output of the workers that ended to be drained."""
        deadline = time.monotonic() + timeout
        for worker in self.workers:
            if worker.status is None:
                continue
            for pump in worker.pumps:
                pump.join(max(0.0, deadline - time.monotonic()))

    def pidfds(self) -> list[int]:
        return [w.pidfd for w in self.workers if w.alive]

    def all_succeeded(self) -> bool:
        return bool(self.workers) and all(w.status is not None and w.status.ok for w in self.workers)

    def by_local_rank(self, local_rank: int) -> Worker | None:
        return next((w for w in self.workers if w.local_rank == local_rank), None)

    # ---- stop -----------------------------------------------------------------------------------

    def stop(self, rnd: Round | None, *, local_ranks: list[int] | None = None,
             first_signal: int = signal.SIGTERM, grace: float = 30.0) -> None:
        """Staged stop of ``local_ranks`` (default all), exits logged but not reported as new; idempotent."""
        targets = [w for w in self.workers if local_ranks is None or w.local_rank in local_ranks]
        if all(w.stopped for w in targets):  # none, or all: no signal, no /proc scan
            return
        ranks = None if local_ranks is None else {w.local_rank for w in targets}
        if self.before_stop:
            self.before_stop(targets)
        for worker in targets:  # stop_all sends the first signal, then SIGKILL to every group still there
            if worker.alive:
                self._kills.sent(worker.pid, signal.Signals(first_signal).name, "SIGKILL")
        stop_all(targets, first_signal=first_signal, grace=grace,
                 on_escalate=lambda w: self.say(f"rank {w.rank} did not stop within {grace:g} s: SIGKILL"),
                 find_strays=lambda: self._strays(targets, ranks),
                 watch=self.watch_stop(grace) if self.watch_stop else None)
        strays.reap_zombies(self.own_pids())
        # Disarm only after the groups are reaped: until then the monitor must still be able to kill them
        # should this agent die mid-stop. Verdicts that arrive meanwhile find the rank gone and are ignored.
        if self.monitor:
            for worker in targets:
                try:
                    self.monitor.disarm(worker.local_rank)
                except Exception:
                    pass
        for worker in targets:
            worker.stopped = True
            if not worker.noticed:
                worker.noticed = True
                self._explain(worker)
                if rnd is not None:
                    self._log_exit(rnd, worker)
                else:
                    drop_empty_stack_file(worker)

    def kill_now(self) -> None:
        """SIGKILL every worker's process group and their strays, without waiting: the agent exits next."""
        for worker in self.workers:
            if worker.alive:
                self._kills.sent(worker.pid, "SIGKILL")
            signal_group(worker, signal.SIGKILL)
        try:
            table, found = self._strays(self.workers, None)
            holder = strays.Strays(groups=())
            holder.add(table, found)
            holder.signal(signal.SIGKILL, everyone=True)
            holder.close()
        except OSError:
            pass  # best effort: /proc unreadable

    def _strays(self, targets: list[Worker], local_ranks: set[int] | None) -> tuple[dict[int, strays.Proc], set[int]]:
        """Descendants of ``targets`` outside their groups, and their orphans (with --virtual-local-rank every
        LOCAL_RANK is 0, so a partial stop leaves orphans to the next full stop)."""
        table = strays.process_table()
        found = strays.descendants(table, (w.pid for w in targets))
        if local_ranks is None or not self.cfg.workers.virtual_local_rank:
            adopted = strays.orphans(table, keep=self.own_pids(), run_id=self.cfg.rendezvous.run_id,
                                     local_ranks=local_ranks)
            found |= adopted | strays.descendants(table, adopted)
        return table, found

    def own_pids(self) -> set[int]:
        """The processes this agent started (workers, standbys, the rank monitor): never taken for strays."""
        own = {w.pid for w in self.workers}
        if self.standby:
            own.update(self.standby.pids())
        pid = self.monitor.pid if self.monitor else None
        if isinstance(pid, int):
            own.add(pid)
        return own

    def close(self) -> None:
        self._store = None
        if self.standby:
            self.standby.close()
        for name, handle in self._filtered.items():
            handle.close()
            if handle.lost_lines:
                self.log.emit("output_lost", rank=None, local_rank=None, stream=f"filtered_{name}",
                              path=str(handle.path), error=describe(handle.error), lost_bytes=handle.lost_bytes,
                              lost_lines=handle.lost_lines)

    def _explain(self, worker: Worker) -> None:
        """Who sent the signal the worker died of (``killcause``), into its status; once, at its exit."""
        worker.status = self._kills.settle(worker.pid, worker.status, since=worker.started)

    def _log_exit(self, rnd: Round, worker: Worker) -> None:
        assert worker.status is not None
        drop_empty_stack_file(worker)
        status = worker.status
        self.log.emit("worker_exit", rank=worker.rank, local_rank=worker.local_rank, pid=worker.pid,
                      round=rnd.index, exit_code=status.code, signal=status.signal,
                      seconds=round((worker.ended or time.monotonic()) - worker.started, 3),
                      killed_by=status.killed_by, kill_detail=status.cause.text if status.cause else None)
