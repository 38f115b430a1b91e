"""A worker forked from the launcher's fork server, made to look like the fresh ``python -u -m boot`` it
stands for, then run through ``boot`` as any worker is.

The fork server (``mbr_launch.workers.forkserver``) is the launcher forked after its ``import torch``. What the
child inherits and a fresh interpreter would not have is reset before the script's first line (descriptors,
session, signals, environment, ``sys.argv``/``orig_argv``/``path[0]``, stdio, torch's C++ log level, the
resolver, gc, faulthandler, numpy's seed, the name in ``ps``), and it ends as the interpreter would. What a fork
cannot give: docs/torchrun.md. Imports only the standard library, ``mbr_launch.contract`` and the shim.
"""

from __future__ import annotations

import atexit
import ctypes
import faulthandler
import fcntl
import gc
import io
import os
import signal
import sys
import threading
import traceback
from typing import Mapping, NoReturn, Sequence

from mbr_launch.forking import close_from
from mbr_launch.shim.envwatch import replace_environ

_PR_SET_PDEATHSIG = 1
# torch's C++ logging levels by name (c10's TORCH_CPP_LOG_LEVEL): an unknown or empty value keeps WARNING.
_CPP_LEVELS = {"INFO": 0, "0": 0, "WARNING": 1, "1": 1, "ERROR": 2, "2": 2, "FATAL": 3, "3": 3}
_CPP_DEFAULT = 1


def become(*, argv: Sequence[str], env: Mapping[str, str], cwd: str, fds: Sequence[int], targets: Sequence[int],
           ignore: Sequence[int], server: int, inherited: Sequence[int] = ()) -> NoReturn:
    """Turn this freshly forked child into the worker ``argv`` and run it; never returns (``os._exit``)."""
    try:
        os.setsid()
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != server:  # the server died before prctl took effect
            os._exit(1)
        _place(fds, targets)
        _reset_signals(ignore, inherited)
        os.chdir(cwd)
        replace_environ(env)
        _reset_interpreter(argv, libc)
    except BaseException:  # noqa: BLE001 - a half-made worker must end here, never go back to the server's loop
        _last_words()
        os._exit(1)
    _run_and_exit()


def _place(fds: Sequence[int], targets: Sequence[int]) -> None:
    """``fds[i]`` at ``targets[i]``; every other descriptor closed."""
    above = max([*fds, *targets, 2]) + 1
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, above) for fd in fds]  # out of the targets' way first
    for fd, target in zip(high, targets):
        os.dup2(fd, target)  # inheritable, as Popen's pass_fds
    close_from(3, keep=set(targets))


def _reset_signals(ignore: Sequence[int], inherited: Sequence[int]) -> None:
    """Dispositions as a new interpreter has them (``inherited`` ignored ones stay ignored through exec, as
    nohup's SIGHUP; Python's own for SIGPIPE, SIGXFSZ and SIGINT; every other default), then ``ignore``."""
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    try:
        signal.set_wakeup_fd(-1)
    except ValueError:
        pass
    kept = set(inherited)
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        if sig in (signal.SIGPIPE, signal.SIGXFSZ) or sig in kept:
            fresh = signal.SIG_IGN
        else:
            fresh = signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL
        try:
            if signal.getsignal(sig) is not fresh:
                signal.signal(sig, fresh)
        except (OSError, ValueError, RuntimeError):
            pass
    for sig in ignore:
        signal.signal(sig, signal.SIG_IGN)


def _reset_interpreter(argv: Sequence[str], libc: ctypes.CDLL) -> None:
    boot_file = os.path.join(os.path.dirname(os.path.abspath(__file__)), "boot.py")
    sys.argv = [boot_file, *argv[4:]]  # argv: python -u -m BOOT_MODULE TARGET...
    sys.orig_argv = list(argv)
    sys.path[0] = os.getcwd()  # as `-m` sets it; boot puts the script's folder there for a script
    sys.stdin = sys.__stdin__ = _stream(0, "r", sys.__stdin__)
    sys.stdout = sys.__stdout__ = _stream(1, "w", sys.__stdout__)
    sys.stderr = sys.__stderr__ = _stream(2, "w", sys.__stderr__)
    gc.enable()
    if faulthandler.is_enabled() and not os.environ.get("PYTHONFAULTHANDLER"):
        faulthandler.disable()
    elif os.environ.get("PYTHONFAULTHANDLER") and not faulthandler.is_enabled():
        faulthandler.enable()
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()  # the legacy global state: a fresh import seeds it from the OS; the fork copied it
    _set_cpp_log_level(os.environ.get("TORCH_CPP_LOG_LEVEL", ""))
    try:
        libc.__res_init()  # the resolver's options from this environment (RES_OPTIONS), as at a fresh start
    except AttributeError:
        pass
    from mbr_launch.shim.proctitle import retitle, set_name

    name = os.path.basename(argv[0]).encode()[:15]
    if retitle(" ".join(argv), name=name) is None:
        set_name(name)  # at least not the launcher's name


def _stream(fd: int, mode: str, like: "io.TextIOWrapper | None") -> io.TextIOWrapper:
    """The unbuffered text stream ``python -u`` makes on ``fd``, with ``like``'s encoding and error handler."""
    encoding = getattr(like, "encoding", None) or "utf-8"
    errors = getattr(like, "errors", None) or "strict"
    raw = io.FileIO(fd, mode, closefd=False)
    if mode == "r":
        return io.TextIOWrapper(io.BufferedReader(raw), encoding=encoding, errors=errors)
    return io.TextIOWrapper(raw, encoding=encoding, errors=errors, write_through=True)  # type: ignore[arg-type]


def _set_cpp_log_level(value: str) -> None:
    """Set torch's C++ log level as a fresh import would read it from ``value``."""
    torch = sys.modules.get("torch")
    if torch is None:
        return
    level = _CPP_LEVELS.get(value.strip().upper(), _CPP_DEFAULT)
    try:
        lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so"))
        ctypes.c_int.in_dll(lib, "FLAGS_caffe2_log_level").value = level
    except (OSError, ValueError):
        pass  # the agent checked the symbol before it chose to fork (``workers.forkserver.usable``)


def _run_and_exit() -> NoReturn:
    """``boot`` as ``python -m`` would run it, then the interpreter's own end: threads, atexit, streams."""
    from mbr_launch.shim import boot

    code: int = 0
    interrupted = False
    try:
        boot.main()
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except KeyboardInterrupt:
        interrupted = True
        _print_uncaught()
    except BaseException:  # noqa: BLE001
        code = 1
        _print_uncaught()
    try:
        threading._shutdown()  # type: ignore[attr-defined]  # what Python waits for before atexit
    except BaseException:  # noqa: BLE001
        pass
    # This process ends with os._exit, never Py_Finalize, so boot's collection of destroyed process groups is
    # not needed here, and running it while gloo's threads still needed the GIL deadlocked the rank's exit.
    atexit.unregister(boot.collect_process_groups_at_exit)
    atexit._run_exitfuncs()
    _flush_open_files()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    try:
        ctypes.CDLL(None).fflush(None)  # C stdio buffers, which exit() flushes and os._exit does not
    except (OSError, AttributeError):
        pass
    if interrupted:  # Python's own exit on an uncaught KeyboardInterrupt: by the signal
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        code = 130
    os._exit(code)


_WRITABLE_FILES = (io.BufferedWriter, io.BufferedRandom, io.TextIOWrapper)


def _flush_open_files() -> None:
    """Flush the files the script left open, as Py_Finalize's deallocations would."""
    for obj in gc.get_objects():
        # type(), not isinstance(): isinstance reads ``__class__``, which some objects answer with a warning
        # (torch.distributed.reduce_op's deprecation) that would then show at every rank's exit.
        if issubclass(type(obj), _WRITABLE_FILES):
            try:
                if not obj.closed:
                    obj.flush()
            except (OSError, ValueError, AttributeError):
                pass


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int) and not isinstance(code, bool):
        return code & 0xFF
    try:
        print(code, file=sys.stderr, flush=True)  # what Python prints for sys.exit("message")
    except (OSError, ValueError):
        pass
    return 1


def _print_uncaught() -> None:
    try:
        sys.excepthook(*sys.exc_info())  # type: ignore[arg-type]
    except BaseException:  # noqa: BLE001
        _last_words()


def _last_words() -> None:
    try:
        traceback.print_exc()
        sys.stderr.flush()
    except BaseException:  # noqa: BLE001
        pass
