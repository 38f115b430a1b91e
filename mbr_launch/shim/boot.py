"""Worker-side entry point: ``python -u -m mbr_launch.shim.boot (-m MODULE | SCRIPT) [ARGS...]``.

Arms what the agent's variables ask for (``MBR_STACK_FILE``: faulthandler stacks, no ptrace needed;
``MBR_FR_TRIGGER``: ``shim.flight``; ``MBR_IGNORE_SIGNALS``; ``MBR_AUTOBEAT``; ``MBR_STANDBY_CHANNEL``: be a warm
standby first, ``shim.standby``), then runs the script as ``python SCRIPT ARGS`` would, tracebacks included.

Must stay cheap and never import torch (scripts set CUDA_VISIBLE_DEVICES, NCCL_* before their own import).
One difference from ``python SCRIPT``: when the script fails, leftover non-daemon threads (e.g. NVRx's
ProgressWatchdog after a failed teardown) get ``EXIT_GRACE`` seconds, then the process exits anyway.
"""

from __future__ import annotations

import atexit
import faulthandler
import gc
import os
import runpy
import signal
import sys
import threading
import time
import types

from mbr_launch.contract import (AUTOBEAT_ENV, BOOT_MODULE, FR_TRIGGER_ENV, STACK_FILE_ENV, STACK_SIGNAL,
                                 STANDBY_CHANNEL_ENV, preemption_signals)

_stack_file = None  # kept open for the life of the process: faulthandler writes to its fd
EXIT_GRACE = 30.0  # seconds a failed script's leftover non-daemon threads get before the process exits anyway


def arm_stack_dump() -> None:
    global _stack_file
    path = os.environ.get(STACK_FILE_ENV)
    if not path:
        return
    try:
        # 0600 and no symlink followed, like every file in the run folder.
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        _stack_file = os.fdopen(fd, "a", buffering=1)
    except OSError:
        return  # a full or failing log disk must not stop the worker: it runs without the stack file
    faulthandler.register(STACK_SIGNAL, file=_stack_file, all_threads=True, chain=False)


def ignore_preemption_signals() -> None:
    """Ignore the preemption signals Slurm sends to every process of the step: the agent forwards them. A
    script that installs its own handler still gets them."""
    for sig in preemption_signals(os.environ):
        try:
            signal.signal(sig, signal.SIG_IGN)
        except (ValueError, OSError):
            pass


def arm_autobeat() -> None:
    if os.environ.get(AUTOBEAT_ENV, "0") in ("", "0"):
        return
    try:  # imported only when asked for: boot stays cheap in workers that do not use it
        from mbr_launch.shim.autobeat import install
    except ImportError:
        return
    install()


def collect_process_groups_at_exit() -> None:
    """Free destroyed process groups (torch keeps gloo's in a reference cycle) before ``Py_Finalize``, where
    their thread could not take the GIL and would abort the process; the destructor releases the GIL."""
    if "torch.distributed" in sys.modules:
        gc.collect()


# Where the frames that come before the script's own are: this package's files and runpy (frozen or not).
_LAUNCHER_FILES = (os.path.dirname(os.path.abspath(__file__)) + os.sep, runpy.__file__, "<frozen runpy>")


def user_frames(exc: BaseException, tb: types.TracebackType | None) -> types.TracebackType | None:
    """``tb`` without its leading launcher frames. All frames the launcher's: none for a SyntaxError (the
    script's, printed with no frames, as Python does), else all (the shim's own failure)."""
    first = tb
    while first is not None and first.tb_frame.f_code.co_filename.startswith(_LAUNCHER_FILES):
        first = first.tb_next
    return first if first is not None or isinstance(exc, SyntaxError) else tb


def unprefixed(hook):  # type: ignore[no-untyped-def]
    """The hook torch's ``init_process_group`` wrapped, when ``hook`` is that wrapper: the agent prefixes each
    line with ``[rankN]:`` already, torch's would add a second. Any other hook is returned as it is."""
    if getattr(hook, "__module__", "") == "torch.distributed.distributed_c10d" and \
            getattr(hook, "__name__", "") == "_distributed_excepthook":
        cells = dict(zip(hook.__code__.co_freevars, (c.cell_contents for c in hook.__closure__ or ())))
        if callable(cells.get("old_hook")):
            return cells["old_hook"]
    return hook


def install_excepthook() -> None:
    """For exceptions that reach the interpreter itself (e.g. KeyboardInterrupt): the script's frames only."""
    hook = sys.excepthook
    if getattr(hook, "mbr_launch_trims", False):
        return

    def excepthook(exc_type, exc, tb):  # type: ignore[no-untyped-def]
        hook(exc_type, exc, _trimmed(exc, tb))

    excepthook.mbr_launch_trims = True  # type: ignore[attr-defined]
    sys.excepthook = excepthook


def _trimmed(exc: BaseException, tb: types.TracebackType | None) -> types.TracebackType | None:
    tb = user_frames(exc, tb)
    # Python's own hook prints the exception's traceback, not the one it is given, when the exception has one.
    exc.__traceback__ = tb
    return tb


def run_target(argv: list[str]) -> None:
    """Run ``argv`` (``-m MODULE ARGS`` or ``SCRIPT ARGS``) as the ``__main__`` program."""
    if not argv:
        raise SystemExit(f"usage: python -m {BOOT_MODULE} (-m MODULE | SCRIPT) [ARGS...]")
    if argv[0] == "-m":
        module, args = argv[1], argv[2:]
        sys.argv = [module, *args]
        # `python -m` puts the working directory first on sys.path; `-m mbr_launch.shim.boot` already did.
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        return
    script, args = argv[0], argv[1:]
    sys.argv = [script, *args]
    # `python script.py` puts the script's directory first, not the working directory.
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")


def run_failing_fast(argv: list[str]) -> None:
    """``run_target``; when the script fails, exit with its code within ``EXIT_GRACE`` (see the docstring)."""
    try:
        run_target(argv)
    except SystemExit as exc:
        if exc.code is None or exc.code == 0:
            raise
        if not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)  # what Python prints for sys.exit("message")
        _exit_failed(exc.code if isinstance(exc.code, int) else 1)
    except Exception as exc:  # shown before waiting for the threads, from the script's frame, prefixed once
        unprefixed(sys.excepthook)(type(exc), exc, _trimmed(exc, exc.__traceback__))
        _exit_failed(1)


def _exit_failed(code: int) -> None:
    deadline = time.monotonic() + EXIT_GRACE
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join(max(0.0, deadline - time.monotonic()))
    left = [t.name for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon and t.is_alive()]
    if not left:
        raise SystemExit(code)  # the usual end: atexit handlers, buffers flushed
    print(f"mbr-launch: the script failed and {len(left)} non-daemon thread(s) still run {EXIT_GRACE:g} s later "
          f"({', '.join(left)}): exiting without them", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main() -> None:
    # First, also in a waiting standby: Slurm signals every process of the step, standbys included.
    ignore_preemption_signals()
    if STANDBY_CHANNEL_ENV in os.environ:  # a warm standby: first wait to become a rank
        # Imported here: only standbys need it, and boot stays cheap in every other worker.
        from mbr_launch.shim.standby import serve

        serve()
        ignore_preemption_signals()  # the assignment's environment decides
    arm_stack_dump()
    if os.environ.get(FR_TRIGGER_ENV):
        from mbr_launch.shim.flight import arm  # imported only when asked for, like autobeat

        arm()
    arm_autobeat()
    install_excepthook()
    # Registered first, so it runs after every atexit handler the script or torch registers.
    atexit.register(collect_process_groups_at_exit)
    run_failing_fast(sys.argv[1:])


if __name__ == "__main__":
    main()
