"""The launcher process's own set-up and how a command fails in front of a person: one line on stderr and an
exit code, never a traceback. Shared by every command and the plain launch, so it imports nothing heavy."""

from __future__ import annotations

import os
import sys
import warnings
from typing import Callable

from mbr_launch import nofile
from mbr_launch.cluster import resolver
from mbr_launch.report import exitcodes

PROG = "mbr-launch"


class CommandError(Exception):
    """A failure the user can fix: printed as one line, exit ``code``."""

    def __init__(self, message: str, code: int = exitcodes.USAGE) -> None:
        super().__init__(message)
        self.code = code


def error(message: str) -> None:
    if sys.stderr is None:  # started with stderr closed; print(file=None) would write to stdout instead
        return
    try:
        print(f"{PROG}: error: {message}", file=sys.stderr, flush=True)
    except OSError:  # stderr is a pipe nobody reads any more: the exit code still says it
        pass


# The environment as the user gave it, before the launcher adjusts its own: settings' env vars are read
# from it and workers inherit it. ``prepare`` takes it again at each call.
USER_ENV: dict[str, str] = dict(os.environ)


def prepare() -> None:
    USER_ENV.clear()
    USER_ENV.update(os.environ)
    # The agent's own store clients time out on purpose (watchers); keep torch's C++ warnings about it
    # out of the user's console. Workers get the user's setting, not this one.
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    resolver.quick_retries(os.environ)  # before the first lookup of this process (glibc reads it then)
    # torch.cuda imports the deprecated pynvml that nvidia-resiliency-ext pulls in: not the user's concern.
    warnings.filterwarnings("ignore", message="The pynvml package is deprecated")
    nofile.raise_soft()  # the store's host needs about 4 descriptors per agent; recorded in the start event


def guarded(run: Callable[[], int]) -> int:
    """``run()``'s exit code; a ``CommandError`` is its message and code, Ctrl-C 130, and a bug of ours one line
    (the traceback with MBR_DEBUG=1)."""
    try:
        return run()
    except CommandError as err:
        error(str(err))
        return err.code
    except KeyboardInterrupt:
        return 130
    except Exception as err:
        if os.environ.get("MBR_DEBUG"):
            raise
        error(f"internal error: {type(err).__name__}: {err} (set MBR_DEBUG=1 for the traceback)")
        return exitcodes.INTERNAL
