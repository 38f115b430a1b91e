"""A waiting standby's name in ``ps``, ``top`` and psutil: ``mbr-launch standby for local rank N (...)``.

A standby is started with its worker's command line (the rank keeps it), so it would look like a worker.
``retitle`` writes a title over the process's argument area (``/proc/PID/cmdline``, as setproctitle(3)) and
names the main thread (``prctl(PR_SET_NAME)``); ``Title.restore`` puts both back. ``sys.argv`` is untouched;
the title never grows past the original arguments. Best effort: without /proc or prctl, nothing changes.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass

from mbr_launch.procstat import read as read_stat

COMM = b"mbr-standby"  # at most 15 bytes: the kernel's thread name
_PR_SET_NAME = 15


@dataclass(frozen=True)
class Title:
    start: int  # the argument area in this process's memory
    original: bytes  # its bytes before the title was written
    comm: bytes  # the thread name before

    def restore(self) -> None:
        _write(self.start, self.original)
        set_name(self.comm)


def retitle(title: str, name: bytes = COMM) -> Title | None:
    """Show ``title`` (cut to fit) as the command line and ``name`` as the thread name; None if not done."""
    me = read_stat(os.getpid())
    if me is None or not me.arg_start or me.arg_end is None:
        return None
    start, end = me.arg_start, me.arg_end
    try:
        with open("/proc/self/comm", "rb") as f:
            comm = f.read().rstrip(b"\n")
        with open("/proc/self/mem", "rb", buffering=0) as mem:
            mem.seek(start)
            original = mem.read(end - start)
    except (OSError, IndexError, ValueError):
        return None
    if len(original) != end - start or len(original) < 2:
        return None
    text = title.encode(errors="replace")[: len(original) - 2]
    # The title, a NUL, then no NUL up to the last byte: a last byte that is no NUL tells the kernel to show
    # the text up to the first NUL rather than every argument.
    if not _write(start, text + b"\0" + b" " * (len(original) - len(text) - 1)):
        return None
    set_name(name)
    return Title(start, original, comm)


def _write(start: int, data: bytes) -> bool:
    try:
        with open("/proc/self/mem", "r+b", buffering=0) as mem:
            mem.seek(start)
            return mem.write(data) == len(data)
    except OSError:
        return False


def set_name(name: bytes) -> None:
    """This thread's name (the main thread's: the process's, in ``ps -e``, ``top`` and ``pgrep``)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_NAME, ctypes.c_char_p(name[:15]), 0, 0, 0)
    except (OSError, AttributeError):
        pass
