"""Warm standby workers, the agent side: processes that paid the start-up cost ahead of time and wait to become a rank.

A standby runs the worker's command line with its environment minus ``ROUND_KEYS``; taking it sends one
``contract.Assignment`` over its channel (its own side: ``shim.standby``). Replacements preload at the lowest
CPU priority until warm, due or assigned, so a standby is never behind a fresh process; a rank starts fresh
when none is usable. Behaviour: docs/performance.md ("Standbys at low priority").
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
REPLENISH_DELAY = 0.5  # seconds a replacement waits before preloading where it cannot lower its priority
# With few cores per rank, replacements importing torch right away slow down the ranks that are starting.
REPLENISH_DELAY_FEW_CORES = 3.0
# How long a replacement stays at the lowest priority into training, and at most after its start.
LOW_PRIORITY_SPAN = REPLENISH_DELAY_FEW_CORES
LOW_PRIORITY_CAP = 120.0


def autogroup_enabled() -> bool:
    """Whether the kernel schedules by autogroup, whose nice value the agent may lower and raise unprivileged."""
    try:
        with open("/proc/sys/kernel/sched_autogroup_enabled") as f:
            return f.read().strip() == "1"
    except OSError:
        return False


def _set_priority(pid: int, nice: int, *, patience: float = 0.3) -> bool:
    """Set a standby's session autogroup to ``nice``. The agent does it, not the standby, whose preload thread
    starved at nice 19 would hold the GIL for seconds. Unprivileged writes are one per 100 ms host-wide
    (EAGAIN): retried for ``patience`` seconds."""
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
    """At least 4 cores per local rank: replacements need not wait long, and the first round's standbys also
    import the default preload list (on fewer cores that would delay the first round)."""
    cpus = cpus if cpus is not None else (os.cpu_count() or 1)
    return cpus >= 4 * max(1, local_world_size)


def replenish_delay(local_world_size: int, cpus: int | None = None) -> float:
    return REPLENISH_DELAY if roomy(local_world_size, cpus) else REPLENISH_DELAY_FEW_CORES


# Worker variables that change each round: a standby gets them with its assignment.
ROUND_KEYS = frozenset({
    "RANK", "GROUP_RANK", "ROLE_RANK", "WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR",
    "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_ERROR_FILE", STACK_FILE_ENV,
})
# Variables a standby may have wrong because nothing reads them before the script runs.
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
    """(argv, standby environment) of a local rank before any round is known. Imports no torch."""
    from types import SimpleNamespace

    from mbr_launch.workers.env import worker_env

    placeholder = SimpleNamespace(rank_offset=0, group_rank=0, world_size=0, group_world_size=0,
                                  master_addr="", master_port=0, restart_count=0)
    env = worker_env(cfg, placeholder, local_rank, environ, error_file=Path(os.devnull),  # type: ignore[arg-type]
                     stack_file=None, monitor_socket=None, launcher_socket=None)
    return worker_argv(cfg, environ, local_rank), standby_env(env)


def early_pool(cfg: "LaunchConfig", environ: Mapping[str, str]) -> "StandbyPool | None":
    """Start the standbys before the launcher imports torch (cold launch); None when standbys are off."""
    level = cfg.standby.level
    if level == "off" or not cfg.workers.use_boot:
        return None
    # None where a fork would not give a worker what a fresh interpreter gives it.
    server = forkserver.start_for(*first_assignment(cfg, environ, 0), preload=cfg.standby.preload) \
        if level in ("torch", "cuda") else None
    pool = StandbyPool(level=level, prepare=lambda local_rank: first_assignment(cfg, environ, local_rank),
                       preload=cfg.standby.preload, optional=cfg.standby.preload_default, server=server)
    pool.fill(range(cfg.workers.nproc_per_node), extras=roomy(cfg.workers.nproc_per_node))
    return pool


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
    """One standby per local rank, started and taken on the agent's main thread only (parent-death signal)."""

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
        """Start a standby for each of ``local_ranks`` that has none. ``background``: a replacement (lowest
        priority, or ``delay`` where it cannot lower it). ``extras``: also import the default preload list."""
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
        # A forked standby is warm at once: no preload to hold back or deprioritise.
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
        # Forked: the server imported the list already; the standby only takes over what the imports read.
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
        # No retry: a standby left at the normal priority only preloads as it always did.
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
        """Give the normal priority back to replacements warm or due; called every turn of the agent's loop."""
        now = time.monotonic() if now is None else now
        for standby in self._ready.values():
            if standby.low and not standby.promoted and (self.state(standby) == "warm" or self._due(standby, now)):
                standby.promoted = _set_priority(standby.process.pid, 0, patience=0.0)

    def _due(self, standby: Standby, now: float) -> bool:
        if now - standby.started >= LOW_PRIORITY_CAP:
            return True
        return self.training_since is not None and now - max(standby.started, self.training_since) >= LOW_PRIORITY_SPAN

    def starting(self) -> None:
        """A round's ranks are starting: replacements stay at the lowest priority until ``training``."""
        self.training_since = None

    def training(self, now: float | None = None) -> None:
        """Every local rank of the round is past its start-up (its first step or heartbeat)."""
        if self.training_since is None:
            self.training_since = time.monotonic() if now is None else now

    @staticmethod
    def state(standby: Standby) -> str:
        """How far the standby is (recorded with the worker's start): "warm" (preloaded or forked), "warming"
        (preloading at the lowest priority) or "starting" (not preloading)."""
        if standby.status >= 0:
            try:
                standby.said += os.read(standby.status, 16)
            except OSError:  # nothing written yet
                pass
        if standby.forked or STANDBY_WARM in standby.said:
            return "warm"
        return "warming" if standby.background else "starting"

    def take(self, spec: "WorkerSpec") -> "Worker | None":
        """The standby of ``spec.local_rank``, now running ``spec``; None (see ``last_miss``) when none is usable."""
        from mbr_launch.workers.process import Worker

        self.last_miss = None
        standby = self._ready.pop(spec.local_rank, None)
        if standby is None:
            self.last_miss = "none ready"
            return None
        state = self.state(standby)
        miss = None
        # The rank must never keep the lowest priority: if the write stays refused, a fresh process goes instead.
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
        """Kill every standby not taken, then end the fork server (its workers die with it: call once they ended)."""
        standbys, self._ready = list(self._ready.values()), {}
        for standby in standbys:
            self._discard(standby)
        if self.server is not None:
            self.server.close()
