"""Forking the launcher itself (for the rank monitor and the fork server), and a child's descriptors afterwards.

A fork is safe only while the process runs one thread (a child could inherit a lock another thread held);
``sys.stdout``/``sys.stderr`` are flushed first, or both processes would write what they buffer.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Collection


def fork_launcher() -> int | None:
    """``os.fork()`` (the child's pid, 0 in the child); None where a fork is not safe here."""
    if not hasattr(os, "fork") or threading.active_count() != 1:
        return None
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    return os.fork()


def close_from(low: int, keep: Collection[int] = ()) -> None:
    """Close every descriptor from ``low`` up, but those in ``keep``."""
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        fds = list(range(low, 65536))
    for fd in fds:
        if fd >= low and fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass  # the listing's own descriptor, closed already
