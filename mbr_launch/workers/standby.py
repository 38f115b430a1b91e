"""Warm standby workers: processes that paid the start-up cost ahead of time and wait to become a rank.

A new worker process spends most of its start-up importing torch (seconds), and on GPUs creating its CUDA
context. None of that depends on the round, so the agent keeps one standby process per local rank that did
it in advance. A standby is started like a worker, with the worker's own command line (``python -u -m
mbr_launch.shim.boot SCRIPT ARGS``: ``ps`` shows what it will run), own session, parent-death signal and output
pipes, and with the worker's environment minus the variables that change each round (``ROUND_KEYS``), plus
``MBR_STANDBY_CHANNEL=FD:LEVEL:DELAY``, which makes ``boot`` call ``serve`` first. When the agent starts a
rank it sends the standby its assignment over that pipe, one JSON message ``{"argv", "env", "cwd"}``; the
standby replaces ``os.environ`` with ``env`` exactly, changes to ``cwd``, and continues through ``boot``'s
normal path, which runs the script as ``python script.py`` (or ``python -m module``) would: same
``sys.argv``, ``sys.orig_argv``, ``__main__`` and ``sys.path[0]``. A new
standby for that local rank is started at once and prepares itself in the background (after ``DELAY``
seconds, so it does not compete for CPU with the ranks that are starting; an assignment that comes during
that wait runs the script at once with nothing preloaded, as a fresh process would; so does one that comes
while the host is far oversubscribed, above ``SATURATED_LOAD_PER_CPU`` runnable processes per CPU, when
standbys hold off their preloading). The agent falls back to a fresh
process when no standby is ready, when one died, or when the worker's environment differs from the
standby's in anything not ``assigned``; standbys never used are killed when the agent exits (and by the
parent-death signal if it is killed).

What each ``--standby`` level pre-initialises before the script's first line:

- ``off``: nothing; every worker is a fresh process (as before standbys existed).
- ``interpreter``: the interpreter and ``mbr_launch.shim.boot`` only. Exactly equivalent to a fresh process.
- ``torch`` (default): also ``import torch`` (which imports numpy when present) with no CUDA
  initialisation. Anything the script changes *before* its own ``import torch`` that torch (or numpy, MKL,
  OpenMP) reads at import time is too late. One case is repaired: when the script changed
  ``OMP_NUM_THREADS`` (or ``MKL_NUM_THREADS``) before its first ``import torch`` statement, the standby
  calls ``torch.set_num_threads`` at that statement with the count a fresh import would have picked (MKL
  caps it at the physical cores unless ``MKL_DYNAMIC=FALSE``), so ``torch.get_num_threads()`` is what a
  fresh process would report. Other changed import-time variables (``MKL_*``, ``KMP_*``, ``OPENBLAS_*``,
  ``TORCH_*``, ``PYTORCH_*``...) are reported with a warning on the rank's stderr. Variables torch reads
  later (``CUDA_VISIBLE_DEVICES``, ``NCCL_*``, ``TORCH_NCCL_*``, ``PYTORCH_CUDA_ALLOC_CONF``, ``MASTER_*``)
  work as usual. Imports through ``importlib.import_module("torch")`` are not watched.
- ``cuda``: also ``torch.cuda.init()`` and a CUDA context on device ``LOCAL_RANK`` (among the devices
  ``CUDA_VISIBLE_DEVICES`` shows), which stays the current device. A script that changes
  ``CUDA_VISIBLE_DEVICES`` or other ``CUDA_*`` variables before ``import torch`` is warned that they had no
  effect. Each GPU then holds a second context (the standby's) while its rank runs.

The variables the launcher itself decides (``OMP_NUM_THREADS``, ``CUDA_VISIBLE_DEVICES`` with
``--virtual-local-rank``, ``MBR_*``) are in the standby's environment from the start, so they are right at
every level. Use ``--standby interpreter`` (or ``off``) for scripts that configure torch through the
environment before importing it; ``--no-python`` never uses standbys.

This module has two halves: ``StandbyPool`` (agent side) and ``serve`` (standby side, called by ``boot``).
The standby side imports only the standard library before its level's preloading.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Mapping, Sequence

from mbr_launch.shim.boot import preemption_signals

if TYPE_CHECKING:
    from mbr_launch.config.model import LaunchConfig
    from mbr_launch.workers.process import Worker, WorkerSpec

LEVELS = ("off", "interpreter", "torch", "cuda")
CHANNEL_ENV = "MBR_STANDBY_CHANNEL"  # FD:LEVEL:DELAY, set in standbys only
PRELOAD_ENV = "MBR_STANDBY_PRELOAD"  # --standby-preload's modules, comma-separated, set in standbys only
REPLENISH_DELAY = 0.5  # seconds a replacement standby waits before preloading (see the module docstring)
# With few cores per rank, replacements importing torch right away slow down the ranks that are starting
# (measured on 2 cores: a failure just after a restart then took 1.6x ft_launcher's time): wait longer there.
REPLENISH_DELAY_FEW_CORES = 3.0


# A standby does not start preloading while the 1-minute load average is above this many runnable processes
# per CPU (32 agents on 2 cores reached 15 per CPU: their standbys importing torch made restarts 4x slower
# than with --standby off); it checks again every SATURATION_RECHECK seconds.
SATURATED_LOAD_PER_CPU = 4.0
SATURATION_RECHECK = 1.0


def replenish_delay(local_world_size: int, cpus: int | None = None) -> float:
    cpus = cpus if cpus is not None else (os.cpu_count() or 1)
    return REPLENISH_DELAY if cpus >= 4 * max(1, local_world_size) else REPLENISH_DELAY_FEW_CORES

# The worker variables that change from round to round: a standby starts without them and gets them with
# its assignment.
ROUND_KEYS = frozenset({
    "RANK", "GROUP_RANK", "ROLE_RANK", "WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR",
    "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_ERROR_FILE", "MBR_STACK_FILE",
})
# Variables a standby's start-up environment may have wrong, because nothing reads them before the script
# runs: boot reads MBR_* after the assignment, NVRx clients FT_*, torch.distributed TORCHELASTIC_* and the
# round's values when the script initialises it. Any other difference makes the standby unusable.
ASSIGNED_PREFIXES = ("MBR_", "FT_", "TORCHELASTIC_")

# Variables read when torch (numpy, MKL, OpenMP) is imported; with --standby cuda also CUDA's. Changing one
# of them before `import torch` has no effect on a standby that imported torch already.
_IMPORT_TIME_PREFIXES = ("OMP_", "MKL_", "KMP_", "GOMP_", "OPENBLAS_", "TORCH", "PYTORCH_")
_CUDA_PREFIXES = ("CUDA_", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_NVML_BASED_CUDA_CHECK", "NVIDIA_TF32_OVERRIDE")
_READ_LATER = ("TORCH_NCCL_", "TORCH_DISTRIBUTED_", "TORCHELASTIC_", "PYTORCH_CUDA_ALLOC_CONF")


def assigned(key: str) -> bool:
    return key in ROUND_KEYS or key.startswith(ASSIGNED_PREFIXES)


def standby_env(worker_env: Mapping[str, str]) -> dict[str, str]:
    """A worker's environment as its standby gets it before the assignment."""
    return {k: v for k, v in worker_env.items() if k not in ROUND_KEYS}


def mismatched_keys(standby: Mapping[str, str], worker: Mapping[str, str]) -> list[str]:
    """Variables not ``assigned`` whose values differ: such a standby cannot become this worker."""
    keys = {k for k in set(standby) | set(worker) if not assigned(k)}
    return sorted(k for k in keys if standby.get(k) != worker.get(k))


# ---- agent side ----------------------------------------------------------------------------------


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
    return cfg.workers.argv(local_rank), standby_env(env)


def early_pool(cfg: "LaunchConfig", environ: Mapping[str, str]) -> "StandbyPool | None":
    """Start the standbys before the launcher itself imports torch, so the workers' start-up overlaps the
    launcher's (cold launch); None when standbys are off."""
    level = cfg.standby.level
    if level == "off" or not cfg.workers.use_boot:
        return None
    pool = StandbyPool(level=level, prepare=lambda local_rank: first_assignment(cfg, environ, local_rank),
                       preload=cfg.standby.preload)
    pool.fill(range(cfg.workers.nproc_per_node))
    return pool


@dataclass
class Standby:
    process: "Worker"  # the standby as a process (its spec is a placeholder until it is taken)
    channel: int  # write end of the assignment pipe
    env: dict[str, str]  # the environment it was started with
    started: float


class StandbyPool:
    """One standby process per local rank, started and taken on the agent's main thread only (the
    parent-death signal belongs to the thread that spawned)."""

    def __init__(self, *, level: str, prepare: Callable[[int], "tuple[Sequence[str], dict[str, str]] | None"],
                 cwd: str | None = None, preload: Sequence[str] = ()) -> None:
        if level not in LEVELS[1:]:
            raise ValueError(f"standby level {level!r}: choose one of {', '.join(LEVELS[1:])}")
        self.level = level
        self.preload = tuple(preload)  # modules imported after the level's own preloading
        self.prepare = prepare  # local rank -> (worker argv, standby environment); None: cannot tell yet
        self.cwd = cwd or os.getcwd()
        self._ready: dict[int, Standby] = {}
        self.last_miss: str | None = None  # why the latest take() found no usable standby

    def fill(self, local_ranks: Iterable[int], *, delay: float = 0.0) -> None:
        """Start a standby for each of ``local_ranks`` that has none."""
        for local_rank in local_ranks:
            if local_rank in self._ready:
                continue
            prepared = self.prepare(local_rank)
            if prepared is not None:
                self._ready[local_rank] = self._start(local_rank, *prepared, delay=delay)

    def _start(self, local_rank: int, argv: Sequence[str], env: dict[str, str], *, delay: float) -> Standby:
        from mbr_launch.workers.process import WorkerSpec, spawn

        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        try:
            # Room for the whole assignment, so that sending it never blocks the agent.
            fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 1 << 20)
        except OSError:
            pass
        os.set_blocking(write_end, False)
        spec = WorkerSpec(local_rank=local_rank, rank=-1, argv=list(argv),
                          env={**env, CHANNEL_ENV: f"{read_end}:{self.level}:{delay:g}",
                               **({PRELOAD_ENV: ",".join(self.preload)} if self.preload else {})},
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            process = spawn(spec, cwd=self.cwd, pass_fds=(read_end,))
        finally:
            os.close(read_end)
        return Standby(process=process, channel=write_end, env=env, started=time.monotonic())

    def take(self, spec: "WorkerSpec") -> "Worker | None":
        """The standby of ``spec.local_rank``, now running ``spec``; None (see ``last_miss``) when there is
        no usable one and the caller must spawn a fresh process."""
        from mbr_launch.workers.process import Worker

        self.last_miss = None
        standby = self._ready.pop(spec.local_rank, None)
        if standby is None:
            self.last_miss = "none ready"
            return None
        miss = self._unusable(standby, spec)
        if miss is None:
            message = json.dumps({"argv": list(spec.argv), "env": spec.env, "cwd": self.cwd}).encode()
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
        proc = standby.process
        return Worker(spec=spec, proc=proc.proc, pidfd=proc.pidfd, started=time.monotonic(),
                      standby_age=round(time.monotonic() - standby.started, 3))

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
        for closing in (lambda: os.close(standby.channel), process.proc.stdout.close,  # type: ignore[union-attr]
                        process.proc.stderr.close):  # type: ignore[union-attr]
            try:
                closing()
            except (OSError, AttributeError):
                pass

    def pids(self) -> list[int]:
        return [s.process.pid for s in self._ready.values()]

    def close(self) -> None:
        """Kill every standby not taken."""
        standbys, self._ready = list(self._ready.values()), {}
        for standby in standbys:
            self._discard(standby)


# ---- standby side --------------------------------------------------------------------------------


def serve() -> None:
    """Run by ``boot`` in a standby: prepare, wait for the assignment, apply it; then boot goes on with its
    own ``sys.argv`` (the worker's command line, checked by the agent), as in a fresh worker."""
    fd, level, delay_text = os.environ.pop(CHANNEL_ENV).split(":")
    channel, delay = int(fd), float(delay_text)
    modules = [m for m in os.environ.pop(PRELOAD_ENV, "").split(",") if m]
    startup_env = dict(os.environ)  # boot has already ignored its preemption signals
    # An assignment that arrives during the wait ends it, and the worker then starts as a fresh process would,
    # with nothing preloaded: preloading now would only delay a script that may not need it.
    early = delay > 0 and bool(select.select([channel], [], [], delay)[0])
    while not early and _saturated():
        early = bool(select.select([channel], [], [], SATURATION_RECHECK)[0])
    if not early:
        _preload(level)
        _preload_modules(modules)
    message = _read_message(channel)
    if not message:
        os._exit(0)  # the agent closed the pipe without an assignment: it is gone or shutting down
    assignment = json.loads(message)
    for sig in preemption_signals(startup_env):  # boot re-applies what the worker's own environment asks for
        signal.signal(sig, signal.SIG_DFL)
    os.environ.clear()
    os.environ.update(assignment["env"])
    if assignment["cwd"] != os.getcwd():
        os.chdir(assignment["cwd"])
        sys.path[0] = os.getcwd()  # as `python -m mbr_launch.shim.boot` sets it; run_target replaces it for a script
    if level in ("torch", "cuda") and not early:
        _watch_torch_import(startup_env, level)


def _saturated() -> bool:
    """The host is far oversubscribed (many agents on few cores): a preload now would slow every process that
    is starting, and a restart would wait for it; wait until the load drops (or the assignment comes)."""
    try:
        return os.getloadavg()[0] > SATURATED_LOAD_PER_CPU * (os.cpu_count() or 1)
    except OSError:
        return False


def _preload_modules(modules: Sequence[str]) -> None:
    """--standby-preload: a module that fails to import is left for the script to meet on its own import."""
    import importlib

    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as err:  # noqa: BLE001 - reported, then the script decides
            print(f"mbr-launch: warm standby: could not preload {name} ({type(err).__name__}: {err}); the script "
                  "will import it itself", file=sys.stderr, flush=True)


def _preload(level: str) -> None:
    if level == "interpreter":
        return
    try:
        import torch
    except Exception:
        return  # the script meets the same error itself, on its own `import torch`
    if level != "cuda":
        return
    try:
        if torch.cuda.is_available():
            device = int(os.environ.get("LOCAL_RANK", "0"))
            if device < torch.cuda.device_count():
                torch.cuda.set_device(device)
                torch.cuda.init()
                torch.empty(1, device=f"cuda:{device}")  # the context itself
    except Exception:
        pass  # the script will meet it too; a standby never fails in its place


def _read_message(channel: int) -> bytes:
    chunks = []
    while True:
        try:
            chunk = os.read(channel, 1 << 20)
        except InterruptedError:
            continue
        if not chunk:
            break
        chunks.append(chunk)
    os.close(channel)
    return b"".join(chunks)


def _watch_torch_import(startup_env: Mapping[str, str], level: str) -> None:
    """At the script's first ``import torch`` (or ``import torch.x``, also from a library it imports; not
    from mbr_launch's own modules), compare the environment with the one torch was imported with: repair OMP_NUM_THREADS, warn about the
    rest. The hook removes itself on first use."""
    import builtins

    original = builtins.__import__

    def hook(name, globals=None, locals=None, fromlist=(), level_=0):  # type: ignore[no-untyped-def]
        importer = str((globals or {}).get("__name__", ""))
        if (name == "torch" or name.startswith("torch.")) and not importer.startswith("mbr_launch"):
            if builtins.__import__ is hook:
                builtins.__import__ = original
            if "torch" in sys.modules:
                try:
                    _reconcile(startup_env, level)
                except Exception:
                    pass  # a repair that fails must not turn into the script's ImportError
        return original(name, globals, locals, fromlist, level_)

    builtins.__import__ = hook


def _read_at_import(key: str, level: str) -> bool:
    if level == "cuda" and key.startswith(_CUDA_PREFIXES):
        return True
    return key.startswith(_IMPORT_TIME_PREFIXES) and not key.startswith(_READ_LATER)


def _fresh_thread_count() -> int | None:
    """The intra-op thread count a fresh ``import torch`` would pick from the environment as it is now
    (ATen's init_num_threads: MKL's thread count when torch uses MKL, else OpenMP's); None: not known."""
    import torch

    def number(name: str) -> int | None:
        value = os.environ.get(name, "").split(",")[0].strip()
        return int(value) if value.isdigit() and int(value) > 0 else None

    if not torch.backends.mkl.is_available():
        return number("OMP_NUM_THREADS")
    count = number("MKL_NUM_THREADS") or number("OMP_NUM_THREADS")
    if count is not None and os.environ.get("MKL_DYNAMIC", "").upper() != "FALSE":
        count = min(count, _physical_cores())  # MKL's default: no more threads than physical cores
    return count


def _physical_cores() -> int:
    cores = set()
    for topology in Path("/sys/devices/system/cpu").glob("cpu[0-9]*/topology"):
        try:
            cores.add(((topology / "physical_package_id").read_text(), (topology / "core_id").read_text()))
        except OSError:
            pass
    return len(cores) or os.cpu_count() or 1


def _reconcile(startup_env: Mapping[str, str], level: str) -> None:
    changed = sorted(k for k in set(startup_env) | set(os.environ)
                     if startup_env.get(k) != os.environ.get(k) and _read_at_import(k, level))
    threads = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
    if any(k in changed for k in threads):
        count = _fresh_thread_count()
        if count is not None:
            import torch

            torch.set_num_threads(count)
            changed = [k for k in changed if k not in threads]
    if changed:
        print(f"mbr-launch: warm standby (--standby {level}): torch was imported before this script ran, so "
              f"{', '.join(changed)} set before `import torch` may have no effect; use --standby interpreter "
              "(or off) if it matters", file=sys.stderr, flush=True)
