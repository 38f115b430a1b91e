"""A warm standby's own side, inside the process: prepare, wait for the assignment, become the rank.

``boot`` calls ``serve`` first when ``MBR_STANDBY_CHANNEL`` is set (the agent side, which starts standbys and
sends their assignments, is ``mbr_launch.workers.standbypool``). The standby preloads what its level says (in a
thread, so that the assignment is read as soon as it comes; an assignment that comes mid-preload starts the
script at once, which waits for the rest only at its first ``import torch``, before a fork and at exit; a
replacement that the agent runs at the lowest priority preloads at once), unless an assignment comes during
the replenish delay or the host is far oversubscribed (above
``SATURATED_LOAD_PER_CPU`` runnable processes per CPU); then it reads its ``Assignment`` (argv, env, cwd),
replaces ``os.environ`` with ``env`` exactly, changes to ``cwd``, and returns to ``boot``, which runs the
script as ``python script.py`` (or ``python -m module``) would: same ``sys.argv``, ``sys.orig_argv``,
``__main__`` and ``sys.path[0]``.

What each ``--standby`` level pre-initialises before the script's first line:

- ``off``: nothing; every worker is a fresh process, as torchrun starts one.
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

``--standby-preload`` modules are imported after the level's own preloading, under the same hold-off on an
oversubscribed host (a script assigned meanwhile waits for them where it waits for torch, see above).
Default: ``torch._dynamo`` at ``torch`` and ``cuda`` (nothing at ``interpreter``), which a script's first
optimizer, ``DistributedDataParallel(...)`` and ``torch.compile`` import on first use (about 2 s of CPU per rank
and restart on 2 cores). A standby forked from the fork server (``workers.forkserver``) has every module of the
list already: the server imported them once, before its first fork, and kept what each import read
(``envwatch.PRELOADED``), which the standby takes over. Otherwise the default list never delays a rank: it is
skipped without a word where torch has none, not begun once the assignment has come (the script imports it
itself if it needs it), and imported by the first round's standbys only where there are at least 4 cores per
local rank (``workers.standbypool.roomy``; on fewer, the replacements import it: two more such imports while
the launcher itself starts would slow the first round). torch._dynamo reads about 280
variables when imported (``TORCHDYNAMO_*``, ``TORCHINDUCTOR_*``, ``TORCH_COMPILE_*``, ``PT2_*``, sympy's,
TMPDIR...): a script that sets one after its own ``import torch`` would find it ignored. The preload
records which ones it read and with what value (``envwatch``); a rank whose environment has another value at
the hand-over, or whose script later sets or deletes one of them to another value, gets one warning line on
its stderr per variable, naming it and the module. Set such variables in the launch environment, or use
``--standby-preload none`` (a module the user names that fails to import is reported; the script then
imports it itself).

The variables the launcher itself decides (``OMP_NUM_THREADS``, ``CUDA_VISIBLE_DEVICES`` with
``--virtual-local-rank``, ``MBR_*``) are in the standby's environment from the start, so they are right at
every level. Use ``--standby interpreter`` (or ``off``) for scripts that configure torch through the
environment before importing it; ``--no-python`` never uses standbys.

Runs inside workers: imports only the standard library, ``mbr_launch.contract`` and ``mbr_launch.fdwait`` before its level's
preloading (torch is imported by ``_preload``, late on purpose).
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

# A standby does not start preloading while the 1-minute load average is above this many runnable processes
# per CPU (32 agents on 2 cores reached 15 per CPU: their standbys importing torch made restarts 4x slower
# than with --standby off); it checks again every SATURATION_RECHECK seconds.
SATURATED_LOAD_PER_CPU = 4.0
SATURATION_RECHECK = 1.0

# Variables read when torch (numpy, MKL, OpenMP) is imported; with --standby cuda also CUDA's. Changing one
# of them before `import torch` has no effect on a standby that imported torch already.
_IMPORT_TIME_PREFIXES = ("OMP_", "MKL_", "KMP_", "GOMP_", "OPENBLAS_", "TORCH", "PYTORCH_")
_CUDA_PREFIXES = ("CUDA_", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_NVML_BASED_CUDA_CHECK", "NVIDIA_TF32_OVERRIDE")
# Flight Recorder's (TORCH_FR_*, TORCH_INCLUDE_*) are read when the first process group is made or at a dump.
_READ_LATER = ("TORCH_NCCL_", "TORCH_DISTRIBUTED_", "TORCHELASTIC_", "PYTORCH_CUDA_ALLOC_CONF", "TORCH_FR_",
               "TORCH_INCLUDE_")


def serve() -> None:
    """Run by ``boot`` in a standby: prepare, wait for the assignment, apply it; then boot goes on with its
    own ``sys.argv`` (the worker's command line, checked by the agent), as in a fresh worker."""
    channel, level, delay, status, background = StandbyChannel.decode(os.environ.pop(STANDBY_CHANNEL_ENV))
    modules = [m for m in os.environ.pop(STANDBY_PRELOAD_ENV, "").split(",") if m]
    reads: envwatch.Reads = {}  # what the modules' imports read from the environment, and wrote to it
    written: dict[str, str | None] = {}
    startup_env = dict(os.environ)  # boot has already ignored its preemption signals
    from mbr_launch.shim.proctitle import retitle  # only standbys need it

    # Named as what it is in `ps` while it waits, not as the worker whose command line it was started with.
    title = retitle(f"mbr-launch standby for local rank {os.environ.get('LOCAL_RANK', '?')}: "
                    + " ".join(sys.argv[1:]))
    # ``background``: the agent runs this standby at the lowest priority (its session's autogroup) and gives
    # the normal one back before the assignment, so it preloads at once; otherwise it waits ``delay`` so as
    # not to slow the ranks that are starting.
    # An assignment that arrives during the wait ends it, and the worker then starts as a fresh process would,
    # with nothing preloaded: preloading now would only delay a script that may not need it.
    early = not background and delay > 0 and bool(ready([channel], delay))
    while not early and not background and _saturated():
        early = bool(ready([channel], SATURATION_RECHECK))
    preloading, assigned, adoption = None, threading.Event(), envwatch.Adoption(reads, written)
    if not early:
        # In a thread, so that an assignment that comes meanwhile is read at once: the priority goes back up
        # before the rest of the preload (which the script would do anyway) runs. The thread owns ``status``
        # from here on (it says "warm" on it, then closes it). Not a daemon: an exit during the preload waits
        # for it (a daemon thread stopped inside torch's C++ initialisation can abort the exit).
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
        # Still importing: the script starts now instead of after the preload. A script that never imports
        # torch (or imports it late) is not held up by an import it does not need (32 agents on 2 cores: 32
        # replacements importing torch at once kept every restarted script waiting 50 s); one that imports
        # it waits at that import for the rest of the preload (below), no longer than a fresh process would.
        envwatch.finish_preload_when_needed(preloading)
    else:
        adoption.preload_done()
    # Now that the environment is the rank's, the script's writes are watched (``envwatch``); with a preload
    # still under way, once it is done (its imports record what they read until then).
    adoption.environment_ready(assignment.env)
    if level in ("torch", "cuda") and not early:
        _watch_torch_import(startup_env, assignment.env, written, level, preloading)


def _prepare(level: str, modules: Sequence[str], status: int, reads: envwatch.Reads,
             written: dict[str, str | None], assigned: threading.Event, background: bool,
             adoption: envwatch.Adoption) -> None:
    try:
        _preload(level)
        # The hold-off applies to the extra modules too (torch._dynamo is as much CPU again as torch): the host
        # may have become oversubscribed while torch was imported. A replacement at the lowest priority goes on.
        while modules and not background and _saturated() and not assigned.wait(SATURATION_RECHECK):
            pass
        _preload_modules(modules, reads, written, assigned)
        _tell(status, STANDBY_WARM)  # the agent takes a replacement that cannot lower its priority only once warm
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


def _tell(fd: int, what: bytes) -> None:
    if fd >= 0:
        try:
            os.write(fd, what)
        except OSError:
            pass  # the agent is gone: the assignment read finds out


def _saturated() -> bool:
    """The host is far oversubscribed (many agents on few cores): a preload now would slow every process that
    is starting, and a restart would wait for it; wait until the load drops (or the assignment comes).

    The 1-minute load average lags a burst by most of a minute: 32 agents started together on 2 cores all
    began preloading while it still read the idle minute before, and doubled the launch's CPU work. So the
    processes runnable at this moment count too."""
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
    """--standby-preload: a module that fails to import is left for the script to meet on its own import
    (reported, unless it comes from the default list: ``OPTIONAL_PRELOAD`` ahead of its name). The
    environment variables each import reads are recorded (``envwatch``). A module of the default list is not
    begun once the assignment has come: the script imports it itself if it needs it, as a fresh process
    would, instead of waiting for a module it may never import. Modules the user named are always imported."""
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
        # `import torch` looks for pynvml, and the deprecated `pynvml` package that nvidia-resiliency-ext (our
        # dependency) installs warns once per process that it is deprecated: noise about how the launcher was
        # installed, which this preload would print on every rank of every round, also for scripts that never
        # import torch. Only that message is filtered, only around this import of ours (catch_warnings puts
        # the filters back): every other warning of the preload is shown, and a script's own
        # `import torch` in a fresh worker (--standby off or interpreter, or a standby assigned before it
        # preloaded) shows it as `python SCRIPT` would, since that import is the script's, not ours.
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
    """At the script's first ``import torch`` (or ``import torch.x``, also from a library it imports; not
    from mbr_launch's own modules), wait for a preload still under way, then compare the environment with the
    one torch was imported with: repair OMP_NUM_THREADS, warn about the rest. The hook removes itself on first
    use."""
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


def _reconcile(startup_env: Mapping[str, str], launch: Mapping[str, str], written: Mapping[str, str | None],
               level: str) -> None:
    """The import-time variables the script changed before its ``import torch``: another value than the launch
    gave (``launch``) and than torch was imported with (``startup_env``), and not the preload's own write
    (``written``: inductor's cache directory, set in the rank's environment when the preload was still running
    at the hand-over)."""
    def by_script(k: str) -> bool:
        now = os.environ.get(k)
        return now != launch.get(k) and now != startup_env.get(k) and (k not in written or now != written[k])

    # envwatch has reported some, and judges those the preloaded modules read (one line per variable, naming
    # the module that read it: TORCHDYNAMO_* are torch._dynamo's, not torch's)
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
