"""A warm standby's own side, inside the process: prepare, wait for the assignment, become the rank.

``boot`` calls ``serve`` first when ``MBR_STANDBY_CHANNEL`` is set (the agent's side is
``mbr_launch.workers.standbypool``). The standby preloads what its ``--standby`` level says, plus the
``--standby-preload`` modules, in a thread (unless assigned during the replenish delay or while the host is
oversubscribed), then takes its ``Assignment`` (argv, env, cwd) and returns to ``boot``, which runs the script
as ``python SCRIPT`` would. What each level preloads, and what a script sees: docs/performance.md, "What each
--standby level pre-initialises". Imports only the standard library, ``mbr_launch.contract`` and
``mbr_launch.fdwait`` before its preload (torch comes late, in ``_preload``, on purpose).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import warnings
from pathlib import Path
from typing import Mapping, Sequence

from mbr_launch.contract import (OPTIONAL_PRELOAD, STANDBY_CHANNEL_ENV, STANDBY_PRELOAD_ENV, STANDBY_WARM, Assignment,
                                 StandbyChannel, preemption_signals)
from mbr_launch.fdwait import ready
from mbr_launch.shim import envwatch

# No preload starts while more than this many processes per CPU are runnable (standbys importing torch on an
# oversubscribed host slowed restarts); checked again every SATURATION_RECHECK seconds.
SATURATED_LOAD_PER_CPU = 4.0
SATURATION_RECHECK = 1.0

# Variables read when torch (numpy, MKL, OpenMP) is imported; with --standby cuda also CUDA's.
_IMPORT_TIME_PREFIXES = ("OMP_", "MKL_", "KMP_", "GOMP_", "OPENBLAS_", "TORCH", "PYTORCH_")
_CUDA_PREFIXES = ("CUDA_", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_NVML_BASED_CUDA_CHECK", "NVIDIA_TF32_OVERRIDE")
# Flight Recorder's (TORCH_FR_*, TORCH_INCLUDE_*) are read when the first process group is made or at a dump.
_READ_LATER = ("TORCH_NCCL_", "TORCH_DISTRIBUTED_", "TORCHELASTIC_", "PYTORCH_CUDA_ALLOC_CONF", "TORCH_FR_",
               "TORCH_INCLUDE_")


def serve() -> None:
    """Prepare, wait for the assignment and apply it; boot then goes on as in a fresh worker."""
    channel, level, delay, status, background = StandbyChannel.decode(os.environ.pop(STANDBY_CHANNEL_ENV))
    modules = [m for m in os.environ.pop(STANDBY_PRELOAD_ENV, "").split(",") if m]
    reads: envwatch.Reads = {}  # what the modules' imports read from the environment, and wrote to it
    written: dict[str, str | None] = {}
    startup_env = dict(os.environ)  # boot has already ignored its preemption signals
    from mbr_launch.shim.proctitle import retitle  # only standbys need it

    # Named as what it is in `ps` while it waits, not as the worker whose command line it was started with.
    title = retitle(f"mbr-launch standby for local rank {os.environ.get('LOCAL_RANK', '?')}: "
                    + " ".join(sys.argv[1:]))
    # At the lowest priority (``background``) it preloads at once, else after ``delay`` (unless assigned first).
    early = not background and delay > 0 and bool(ready([channel], delay))
    while not early and not background and _saturated():
        early = bool(ready([channel], SATURATION_RECHECK))
    preloading, assigned, adoption = None, threading.Event(), envwatch.Adoption(reads, written)
    if not early:
        # In a thread, so that an assignment is read at once. The thread owns ``status`` from here on. Not a
        # daemon: a daemon thread stopped inside torch's C++ initialisation can abort the exit.
        preloading = threading.Thread(target=_prepare, name="standby-preload",
                                      args=(level, modules, status, reads, written, assigned, background, adoption))
        preloading.start()
    elif status >= 0:
        os.close(status)
    message = _read_message(channel)
    assigned.set()
    if title is not None:
        title.restore()
    if not message:
        os._exit(0)  # the agent closed the pipe without an assignment: it is gone or shutting down
    if preloading is not None and (level == "cuda" or not preloading.is_alive()):
        preloading.join()  # the CUDA context is made in the preload thread: adopt it before the script runs
        _adopt_device(level)
        preloading = None
    assignment = Assignment.decode(message)
    for sig in preemption_signals(startup_env):  # boot re-applies what the worker's own environment asks for
        signal.signal(sig, signal.SIG_DFL)
    envwatch.replace_environ(assignment.env)
    if assignment.cwd != os.getcwd():
        os.chdir(assignment.cwd)
        sys.path[0] = os.getcwd()  # as `python -m mbr_launch.shim.boot` sets it; run_target replaces it for a script
    if preloading is not None:
        # Still importing: the script starts now and waits only at its first `import torch` (below).
        envwatch.finish_preload_when_needed(preloading)
    else:
        adoption.preload_done()
    # The script's writes are watched from now on (``envwatch``), or once a preload still under way is done.
    adoption.environment_ready(assignment.env)
    if level in ("torch", "cuda") and not early:
        _watch_torch_import(startup_env, assignment.env, written, level, preloading)


def _prepare(level: str, modules: Sequence[str], status: int, reads: envwatch.Reads,
             written: dict[str, str | None], assigned: threading.Event, background: bool,
             adoption: envwatch.Adoption) -> None:
    try:
        _preload(level)
        # The hold-off applies to the extra modules too (torch._dynamo costs as much CPU again as torch).
        while modules and not background and _saturated() and not assigned.wait(SATURATION_RECHECK):
            pass
        _preload_modules(modules, reads, written, assigned)
        if status >= 0:
            try:  # the agent takes a replacement that cannot lower its priority only once warm
                os.write(status, STANDBY_WARM)
            except OSError:
                pass  # the agent is gone: the assignment read finds out
    finally:
        if status >= 0:
            os.close(status)
        adoption.preload_done()


def _adopt_device(level: str) -> None:
    """The CUDA device is current per thread: make the preload thread's current in the main thread too."""
    if level != "cuda" or "torch" not in sys.modules:
        return
    try:
        import torch

        if torch.cuda.is_initialized():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    except Exception:
        pass


def _saturated() -> bool:
    """The host is far oversubscribed: by the 1-minute load average, or by the processes runnable right now
    (the average lags a burst of agents starting together by most of a minute)."""
    limit = SATURATED_LOAD_PER_CPU * (os.cpu_count() or 1)
    try:
        if os.getloadavg()[0] > limit:
            return True
    except OSError:
        pass
    return _running_now() > limit


def _running_now() -> int:
    """Processes runnable on the host right now (``procs_running`` in /proc/stat); 0 where unknown."""
    try:
        with open("/proc/stat", "rb") as f:
            for line in f:
                if line.startswith(b"procs_running "):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _preload_modules(modules: Sequence[str], reads: envwatch.Reads, written: dict[str, str | None],
                     assigned: threading.Event) -> None:
    """--standby-preload, recording what each import reads (``envwatch``). A failed import is reported unless
    the module is from the default list (``OPTIONAL_PRELOAD`` prefix); those are skipped once assigned."""
    import importlib

    for entry in modules:
        name = entry.removeprefix(OPTIONAL_PRELOAD)
        if name != entry and assigned.is_set():
            continue
        if name in sys.modules and name in envwatch.PRELOADED:  # forked from a server that imported it
            seen, wrote = envwatch.PRELOADED[name]
            for key, value in seen.items():
                reads.setdefault(key, value)
            for key, change in wrote.items():
                written.setdefault(key, change)
            continue
        try:
            with envwatch.recording(reads, written, name):
                importlib.import_module(name)
        except Exception as err:  # noqa: BLE001 - reported, then the script decides
            if name == entry:
                print(f"mbr-launch: warm standby: could not preload {name} ({type(err).__name__}: {err}); the "
                      "script will import it itself", file=sys.stderr, flush=True)


# The one warning the preload silences, and only while it runs (see _preload).
PYNVML_DEPRECATED = "The pynvml package is deprecated"


def _preload(level: str) -> None:
    if level == "interpreter":
        return
    try:
        # The deprecated `pynvml` that nvidia-resiliency-ext installs warns at `import torch` (noise about the
        # launcher's install): filtered around this import of ours only, not the script's own.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=PYNVML_DEPRECATED, category=FutureWarning)
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


def _watch_torch_import(startup_env: Mapping[str, str], launch: Mapping[str, str],
                        written: Mapping[str, str | None], level: str,
                        preloading: threading.Thread | None = None) -> None:
    """At the script's first ``import torch`` (or of a submodule, by any module outside mbr_launch): wait for a
    preload still under way, then repair OMP_NUM_THREADS and warn about other changed import-time variables."""
    def torch_import(name: str, fromlist: object, level_: int) -> bool:
        # torch importing its own parts inside the preload still under way is not the script's import
        return (name == "torch" or name.startswith("torch.")) and threading.current_thread() is not preloading

    def repair() -> None:
        if preloading is not None:
            preloading.join()
        if "torch" in sys.modules:
            try:
                _reconcile(startup_env, launch, written, level)
            except Exception:
                pass  # a repair that fails must not turn into the script's ImportError

    envwatch.on_first_import(torch_import, repair)


def _read_at_import(key: str, level: str) -> bool:
    if level == "cuda" and key.startswith(_CUDA_PREFIXES):
        return True
    return key.startswith(_IMPORT_TIME_PREFIXES) and not key.startswith(_READ_LATER)


def _fresh_thread_count() -> int | None:
    """The thread count a fresh ``import torch`` would pick now (ATen's init_num_threads); None: unknown."""
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


def _reconcile(startup_env: Mapping[str, str], launch: Mapping[str, str], written: Mapping[str, str | None],
               level: str) -> None:
    """Repair or report the import-time variables the script changed before its ``import torch``: values
    other than the launch's, the preload's start-up ones and the preload's own writes (``written``)."""
    def by_script(k: str) -> bool:
        now = os.environ.get(k)
        return now != launch.get(k) and now != startup_env.get(k) and (k not in written or now != written[k])

    # envwatch judges the variables the preloaded modules read (naming the module), and reports some itself
    changed = sorted(k for k in set(startup_env) | set(os.environ) | set(launch)
                     if _read_at_import(k, level) and by_script(k) and k not in envwatch.reported
                     and k not in envwatch.Judged.reads)
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
