"""Warm standby workers: processes that paid the start-up cost ahead of time and wait to become a rank.

A new worker process spends most of its start-up importing torch (seconds), and on GPUs creating its CUDA
context. None of that depends on the round, so the agent keeps one standby process per local rank that did
it in advance. A standby is started like a worker, with the worker's own command line (``python -u -m
mbr_launch.shim.boot SCRIPT ARGS``; ``ps`` names it ``mbr-launch standby`` while it waits), own session,
parent-death signal and output pipes, and with the worker's environment minus the variables that change each round
(``ROUND_KEYS``), plus ``MBR_STANDBY_CHANNEL=FD:LEVEL:DELAY``, which makes ``boot`` call
``mbr_launch.shim.standby.serve`` first. When the agent starts a rank it sends the standby its assignment
over that pipe (``contract.Assignment``: one JSON message ``{"argv", "env", "cwd"}``); the standby replaces
``os.environ`` with ``env`` exactly, changes to ``cwd``, and continues through ``boot``'s normal path, which
runs the script as ``python script.py`` (or ``python -m module``) would: same ``sys.argv``,
``sys.orig_argv``, ``__main__`` and ``sys.path[0]``. A new standby for that local rank is started at once
and prepares itself in the background: at once, at the lowest CPU priority (its session's autogroup at nice
19, so it takes no CPU the ranks want), where the host schedules by autogroup; the agent gives it the normal
priority back as soon as it is warm (idle, it costs nothing there), once it has spent ``LOW_PRIORITY_SPAN``
seconds not warm while this node's ranks train (while they start, the job's own start comes first, up to
``LOW_PRIORITY_CAP``), or at the latest just before its assignment (``_set_priority``), so what it has done is a head
start and never a
wait. Where it cannot lower its priority it waits ``DELAY`` seconds instead, so as not to compete with the
ranks that are starting (an assignment that comes during that wait runs the script at once with nothing
preloaded, as a fresh process would; so does one that comes while the host is far oversubscribed, above
``shim.standby.SATURATED_LOAD_PER_CPU`` runnable processes per CPU, when such standbys hold off their
preloading). Each ``worker_start`` event records how far its standby was (``StandbyPool.state``). The agent falls back to a fresh process when no standby is ready, when one died, or when the
worker's environment differs from the standby's in anything not ``assigned``; standbys never used are
killed when the agent exits (and by the parent-death signal if it is killed).

What each ``--standby`` level pre-initialises, and how a standby becomes its rank, is described with the
standby's own side, ``mbr_launch.shim.standby`` (it runs inside the process; this module is the agent side:
``StandbyPool``, which starts standbys and sends their assignments, and the environment matching).
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Mapping, Sequence

from mbr_launch.contract import (OPTIONAL_PRELOAD, STACK_FILE_ENV, STANDBY_CHANNEL_ENV, STANDBY_LEVELS,
                                 STANDBY_PRELOAD_ENV, STANDBY_WARM, Assignment, StandbyChannel)
from mbr_launch.workers import flightrec, forkserver
from mbr_launch.workers.numa import worker_argv

if TYPE_CHECKING:
    from mbr_launch.config.model import LaunchConfig
    from mbr_launch.workers.process import Worker, WorkerSpec

LEVELS = STANDBY_LEVELS
REPLENISH_DELAY = 0.5  # seconds a replacement standby waits before preloading (see the module docstring)
# With few cores per rank, replacements importing torch right away slow down the ranks that are starting
# (measured on 2 cores: a failure just after a restart then took 1.6x ft_launcher's time): wait longer there.
REPLENISH_DELAY_FEW_CORES = 3.0


# A replacement preloads at the lowest priority for this long once this node's ranks are training; one not
# warm by then gets the normal priority back (on a host loaded by others it would otherwise never warm up; it
# then competes as a preload after REPLENISH_DELAY_FEW_CORES would), so it is never behind what waiting
# REPLENISH_DELAY_FEW_CORES and preloading would give. While the ranks start (32 agents on 2 cores: minutes)
# it stays low: the job's own start comes first (issue #38), up to LOW_PRIORITY_CAP seconds after its own start.
LOW_PRIORITY_SPAN = REPLENISH_DELAY_FEW_CORES
LOW_PRIORITY_CAP = 120.0


def autogroup_enabled() -> bool:
    """Whether the kernel schedules by autogroup (one per session): then a standby's priority is its session's
    autogroup nice value, which the agent may lower and raise again without privilege."""
    try:
        with open("/proc/sys/kernel/sched_autogroup_enabled") as f:
            return f.read().strip() == "1"
    except OSError:
        return False


def _set_priority(pid: int, nice: int, *, patience: float = 0.3) -> bool:
    """Set a standby's session autogroup to ``nice``: 19 from its start, 0 (a new session's, as a fresh
    worker's) before its assignment or at its promotion. The agent does it, not the standby: the standby's main
    thread could act only once it holds the GIL, which its preload thread, starved at nice 19, releases seconds
    later on a loaded host. Unprivileged writes are limited to one per 100 ms host-wide (EAGAIN): retried for
    ``patience`` seconds."""
    import errno

    deadline = time.monotonic() + patience
    while True:
        try:
            with open(f"/proc/{pid}/autogroup", "w") as f:
                f.write(str(nice))
            return True
        except OSError as err:
            if err.errno != errno.EAGAIN or time.monotonic() >= deadline:
                return False
            time.sleep(0.01)


def roomy(local_world_size: int, cpus: int | None = None) -> bool:
    """At least 4 cores per local rank: replacements need not wait long, and the first round's standbys import
    the default preload list (torch._dynamo) too, where no fork server imported it for them. On fewer cores they leave it to the replacements: more
    imports as heavy as torch's while the launcher itself starts would delay the first round, and a script
    that never imports torch._dynamo would wait for it. Modules the user names are imported by every standby."""
    cpus = cpus if cpus is not None else (os.cpu_count() or 1)
    return cpus >= 4 * max(1, local_world_size)


def replenish_delay(local_world_size: int, cpus: int | None = None) -> float:
    return REPLENISH_DELAY if roomy(local_world_size, cpus) else REPLENISH_DELAY_FEW_CORES


# The worker variables that change from round to round: a standby starts without them and gets them with
# its assignment.
ROUND_KEYS = frozenset({
    "RANK", "GROUP_RANK", "ROLE_RANK", "WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR",
    "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_ERROR_FILE", STACK_FILE_ENV,
})
# Variables a standby's start-up environment may have wrong, because nothing reads them before the script
# runs: boot reads MBR_* after the assignment, NVRx clients FT_*, torch.distributed TORCHELASTIC_* and the
# round's values when the script initialises it; Flight Recorder's (per-rank paths) only when a process group
# is made. Any other difference makes the standby unusable.
ASSIGNED_PREFIXES = ("MBR_", "FT_", "TORCHELASTIC_")
ASSIGNED_KEYS = flightrec.TORCH_ENV


def assigned(key: str) -> bool:
    return key in ROUND_KEYS or key in ASSIGNED_KEYS or key.startswith(ASSIGNED_PREFIXES)


def standby_env(worker_env: Mapping[str, str]) -> dict[str, str]:
    """A worker's environment as its standby gets it before the assignment."""
    return {k: v for k, v in worker_env.items() if k not in ROUND_KEYS}


def mismatched_keys(standby: Mapping[str, str], worker: Mapping[str, str]) -> list[str]:
    """Variables not ``assigned`` whose values differ: such a standby cannot become this worker."""
    keys = {k for k in set(standby) | set(worker) if not assigned(k)}
    return sorted(k for k in keys if standby.get(k) != worker.get(k))


def first_assignment(cfg: "LaunchConfig", environ: Mapping[str, str],
                     local_rank: int) -> "tuple[list[str], dict[str, str]]":
    """(argv, standby environment) of a local rank before any round is known: the round's values are
    filled in when the standby is taken. Imports no torch, so the launcher can start standbys first."""
    from types import SimpleNamespace

    from mbr_launch.workers.env import worker_env

    placeholder = SimpleNamespace(rank_offset=0, group_rank=0, world_size=0, group_world_size=0,
                                  master_addr="", master_port=0, restart_count=0)
    env = worker_env(cfg, placeholder, local_rank, environ, error_file=Path(os.devnull),  # type: ignore[arg-type]
                     stack_file=None, monitor_socket=None, launcher_socket=None)
    return worker_argv(cfg, environ, local_rank), standby_env(env)


def early_pool(cfg: "LaunchConfig", environ: Mapping[str, str]) -> "StandbyPool | None":
    """Start the standbys before the launcher itself imports torch, so the workers' start-up overlaps the
    launcher's (cold launch); None when standbys are off."""
    level = cfg.standby.level
    if level == "off" or not cfg.workers.use_boot:
        return None
    server = _fork_server(cfg, environ) if level in ("torch", "cuda") else None
    pool = StandbyPool(level=level, prepare=lambda local_rank: first_assignment(cfg, environ, local_rank),
                       preload=cfg.standby.preload, optional=cfg.standby.preload_default, server=server)
    pool.fill(range(cfg.workers.nproc_per_node), extras=roomy(cfg.workers.nproc_per_node))
    return pool


def _fork_server(cfg: "LaunchConfig", environ: Mapping[str, str]) -> "forkserver.ForkServer | None":
    """The fork server for this launch's standbys (``workers.forkserver``); None where a fork would not give a
    worker what a fresh interpreter gives it (each standby then imports torch itself)."""
    return forkserver.start_for(*first_assignment(cfg, environ, 0), preload=cfg.standby.preload)


@dataclass
class Standby:
    process: "Worker"  # the standby as a process (its spec is a placeholder until it is taken)
    channel: int  # write end of the assignment pipe
    env: dict[str, str]  # the environment it was started with
    started: float
    status: int = -1  # read end of the pipe on which it says it is warm (-1: none)
    background: bool = False  # a replacement, run at the lowest priority until assigned or promoted
    said: bytes = b""  # what it wrote on its status pipe so far
    low: bool = False  # the agent did lower its priority (a background standby; the write may fail)
    promoted: bool = False  # given the normal priority back before its assignment (``promote``)
    forked: bool = False  # from the fork server: torch imported before it was born


class StandbyPool:
    """One standby process per local rank, started and taken on the agent's main thread only (the
    parent-death signal belongs to the thread that spawned)."""

    def __init__(self, *, level: str, prepare: Callable[[int], "tuple[Sequence[str], dict[str, str]] | None"],
                 cwd: str | None = None, preload: Sequence[str] = (), optional: bool = False,
                 server: "forkserver.ForkServer | None" = None) -> None:
        if level not in LEVELS[1:]:
            raise ValueError(f"standby level {level!r}: choose one of {', '.join(LEVELS[1:])}")
        self.level = level
        self.preload = tuple(preload)  # modules imported after the level's own preloading
        self.optional = optional  # the default list: a module that cannot be imported is skipped quietly
        self.prepare = prepare  # local rank -> (worker argv, standby environment); None: cannot tell yet
        self.cwd = cwd or os.getcwd()
        self._ready: dict[int, Standby] = {}
        self.last_miss: str | None = None  # why the latest take() found no usable standby
        self.training_since: float | None = float("-inf")  # when this node's ranks began training (None: starting)
        self.server = server  # forks standbys with torch imported already (None: each is a new interpreter)

    def fill(self, local_ranks: Iterable[int], *, delay: float = 0.0, background: bool = False,
             extras: bool = True) -> None:
        """Start a standby for each of ``local_ranks`` that has none. ``background``: a replacement, which
        preloads at once at the lowest CPU priority (or after ``delay`` where it cannot lower it) and is taken
        only once warm: a rank never waits for a standby that is behind a fresh process. ``extras``: it also
        imports ``preload`` where that is the default list (``optional``; see ``roomy``)."""
        for local_rank in local_ranks:
            if local_rank in self._ready:
                continue
            prepared = self.prepare(local_rank)
            if prepared is not None:
                self._ready[local_rank] = self._start(local_rank, *prepared, delay=delay, background=background,
                                                      extras=extras)

    def _start(self, local_rank: int, argv: Sequence[str], env: dict[str, str], *, delay: float,
               background: bool = False, extras: bool = True) -> Standby:
        from mbr_launch.workers.process import WorkerSpec, spawn

        forked = self.server is not None and not self.server.gone and forkserver.forkable(argv) and \
            not forkserver.differences(self.server.environ, env)
        # A forked standby has torch already: it is warm at once and has no preload to hold back or deprioritise.
        background = background and autogroup_enabled() and not forked
        status_read, status_write = os.pipe2(os.O_CLOEXEC)
        os.set_blocking(status_read, False)
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        try:
            # Room for the whole assignment, so that sending it never blocks the agent.
            fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 1 << 20)
        except OSError:
            pass
        os.set_blocking(write_end, False)
        # Forked: the server imported the list before its first fork; the standby only takes over the record of
        # what the imports read (``envwatch.PRELOADED``), or tries a module that failed there.
        wanted = forked or extras or not self.optional
        preload = ",".join(OPTIONAL_PRELOAD * self.optional + m for m in self.preload) if wanted else ""
        spec = WorkerSpec(local_rank=local_rank, rank=-1, argv=list(argv),
                          env={**env, STANDBY_CHANNEL_ENV: StandbyChannel(read_end, self.level, 0.0 if forked else delay,
                                                                          status_write, background or forked).encode(),
                               STANDBY_PRELOAD_ENV: preload},  # always: it hides the launch environment's
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            process = self._fork(spec, (read_end, status_write)) if forked else None
            if process is None:
                process = spawn(spec, cwd=self.cwd, pass_fds=(read_end, status_write))
        finally:
            os.close(read_end)
            os.close(status_write)
        # Lowest priority from its interpreter's start on. No retry: unprivileged writes are one per 100 ms
        # host-wide, and a standby left at the normal priority only preloads as it always did.
        low = background and _set_priority(process.pid, 19, patience=0.0)
        return Standby(process=process, channel=write_end, env=env, started=time.monotonic(), status=status_read,
                       background=background, low=low, forked=isinstance(process.proc, forkserver.ServedProcess))

    def _fork(self, spec: "WorkerSpec", pass_fds: Sequence[int]) -> "Worker | None":
        from mbr_launch.workers.process import Worker

        assert self.server is not None
        try:
            proc = self.server.spawn(spec.argv, spec.env, cwd=self.cwd, stdout=spec.stdout, stderr=spec.stderr,
                                     pass_fds=pass_fds)
        except forkserver.ForkServerGone:
            return None
        return Worker(spec=spec, proc=proc, pidfd=os.pidfd_open(proc.pid), started=time.monotonic())  # type: ignore[arg-type]

    def promote(self, now: float | None = None) -> None:
        """Give the normal priority back to replacements that are warm (an idle process costs nothing at any
        priority, and its assignment then needs no write on the restart's path) or that have preloaded at the
        lowest one for ``LOW_PRIORITY_SPAN`` seconds of a training round (``training_since``), at the latest
        ``LOW_PRIORITY_CAP`` seconds after their start (called from every turn of the agent's loop; a write
        refused by the rate limit is tried again at the next turn)."""
        now = time.monotonic() if now is None else now
        for standby in self._ready.values():
            if standby.low and not standby.promoted and (self.state(standby) == "warm" or self._due(standby, now)):
                standby.promoted = _set_priority(standby.process.pid, 0, patience=0.0)

    def _due(self, standby: Standby, now: float) -> bool:
        if now - standby.started >= LOW_PRIORITY_CAP:
            return True
        return self.training_since is not None and now - max(standby.started, self.training_since) >= LOW_PRIORITY_SPAN

    def starting(self) -> None:
        """A round's ranks are starting: replacements made from now on stay at the lowest priority until
        ``training``."""
        self.training_since = None

    def training(self, now: float | None = None) -> None:
        """Every local rank of the round is past its start-up (its first step or heartbeat)."""
        if self.training_since is None:
            self.training_since = time.monotonic() if now is None else now

    @staticmethod
    def state(standby: Standby) -> str:
        """How far the standby is when taken (recorded with the worker's start): "warm" (preloaded, or forked
        with torch imported),
        "warming" (preloading at the lowest priority: it takes the normal one back when assigned, so what it
        has done is a head start), or "starting" (not preloading: it runs the script at once, as a fresh
        process would, minus the interpreter's start-up it has behind it). No state leaves a standby behind a
        fresh process: it never keeps a low priority it cannot give back (``shim.standby``)."""
        if standby.status >= 0:
            try:
                standby.said += os.read(standby.status, 16)
            except OSError:  # nothing written yet
                pass
        if standby.forked or STANDBY_WARM in standby.said:
            return "warm"
        return "warming" if standby.background else "starting"

    def take(self, spec: "WorkerSpec") -> "Worker | None":
        """The standby of ``spec.local_rank``, now running ``spec``; None (see ``last_miss``) when there is
        no usable one and the caller must spawn a fresh process."""
        from mbr_launch.workers.process import Worker

        self.last_miss = None
        standby = self._ready.pop(spec.local_rank, None)
        if standby is None:
            self.last_miss = "none ready"
            return None
        state = self.state(standby)
        miss = None
        # Its main thread must wake at full speed, and the rank must never keep the lowest priority: if the
        # write is refused for longer than several ranks' worth of the host-wide limit (one unprivileged write
        # per 100 ms), a fresh process takes its place.
        if standby.low and not standby.promoted and not _set_priority(standby.process.pid, 0, patience=1.0):
            miss = "could not give it the normal priority back"
        miss = miss or self._unusable(standby, spec)
        if miss is None:
            message = Assignment(argv=tuple(spec.argv), env=spec.env, cwd=self.cwd).encode()
            try:
                if len(message) > fcntl.fcntl(standby.channel, fcntl.F_GETPIPE_SZ):
                    miss = "assignment larger than the pipe"
                else:
                    os.write(standby.channel, message)  # fits: a pipe write this size is atomic, never partial
            except OSError as err:  # BrokenPipe: it died just now
                miss = f"could not send the assignment ({err.strerror})"
        if miss is not None:
            self.last_miss = miss
            self._discard(standby)
            return None
        os.close(standby.channel)  # end of message
        self._close_status(standby)
        proc = standby.process
        return Worker(spec=spec, proc=proc.proc, pidfd=proc.pidfd, started=time.monotonic(),
                      standby_age=round(time.monotonic() - standby.started, 3), standby_state=state)

    def _unusable(self, standby: Standby, spec: "WorkerSpec") -> str | None:
        if standby.process.reap() is not None:
            return f"standby died ({standby.process.status.describe() if standby.process.status else '?'})"
        if list(spec.argv) != list(standby.process.spec.argv):
            return "another command line"
        differ = mismatched_keys(standby.env, spec.env)
        if differ:
            return "environment differs in " + ",".join(differ[:5]) + ("..." if len(differ) > 5 else "")
        return None

    def _discard(self, standby: Standby) -> None:
        from mbr_launch.workers.process import signal_group

        process = standby.process
        signal_group(process, signal.SIGKILL)
        if process.alive:
            process.proc.wait()
            process.reap()
        self._close_status(standby)
        for closing in (lambda: os.close(standby.channel), process.proc.stdout.close,  # type: ignore[union-attr]
                        process.proc.stderr.close):  # type: ignore[union-attr]
            try:
                closing()
            except (OSError, AttributeError):
                pass

    @staticmethod
    def _close_status(standby: Standby) -> None:
        if standby.status >= 0:
            try:
                os.close(standby.status)
            except OSError:
                pass
            standby.status = -1

    def pids(self) -> list[int]:
        """The standbys' and the fork server's."""
        server = [self.server.pid] if self.server is not None and not self.server.gone else []
        return [s.process.pid for s in self._ready.values()] + server

    def close(self) -> None:
        """Kill every standby not taken, then end the fork server (the workers it forked die with it: call
        once they have ended)."""
        standbys, self._ready = list(self._ready.values()), {}
        for standby in standbys:
            self._discard(standby)
        if self.server is not None:
            self.server.close()
