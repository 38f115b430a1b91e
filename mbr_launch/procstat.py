"""One process's ``/proc/<pid>/stat`` and ``/proc/<pid>/environ``, each read in one place; standard library
only (the rank monitor and the shim import it).

The command name in ``pid (comm) state ...`` may hold spaces, parentheses and newlines, so the fields are
taken after the LAST ``)``. Reads are bounded; a process that is gone (or a file unreadable) is None, never an
exception: a pid can vanish between any two calls.
"""

from __future__ import annotations

import os
from typing import Dict, List, NamedTuple, Optional

MAX_BYTES = 4096  # the line is ~300 bytes: a 64-byte name and 52 numbers of at most 20 digits fit many times over
# An environment is at most a quarter of the stack limit (execve's rule): 8 MiB is a 32 MiB stack's.
MAX_ENVIRON = 8 << 20
ZOMBIE_STATES = frozenset("ZXx")  # dead, waiting to be reaped (Z) or being torn down (X; x before 3.14)


class Stat(NamedTuple):
    """The fields of ``/proc/<pid>/stat`` this package uses (``man 5 proc``: fields 1-6, 14, 15, 22, 48, 49)."""

    pid: int
    comm: str  # the command name, as the kernel has it (at most 15 bytes for a process, more for a kthread)
    state: str  # one letter: R S D T t Z X I ...
    ppid: int
    pgid: int
    session: int
    utime: int  # clock ticks (SC_CLK_TCK) in user mode
    stime: int  # ... and in kernel mode
    start_time: int  # clock ticks after boot at which it started: with the pid, names one process for good
    arg_start: Optional[int] = None  # where the command line lies in its memory (Linux 3.5+; 0 when hidden)
    arg_end: Optional[int] = None

    @property
    def zombie(self) -> bool:
        return self.state in ZOMBIE_STATES

    @property
    def cpu_ticks(self) -> int:
        return self.utime + self.stime


def parse(raw: bytes) -> Optional[Stat]:
    """A ``/proc/<pid>/stat`` line parsed; None when it is not one."""
    head, sep, tail = raw.rpartition(b")")
    pid_text, paren, comm = head.partition(b" (")
    fields = tail.split()
    if not sep or not paren or len(fields) < 20:
        return None
    try:
        return Stat(pid=int(pid_text), comm=comm.decode(errors="replace"), state=fields[0].decode(errors="replace"),
                    ppid=int(fields[1]), pgid=int(fields[2]), session=int(fields[3]), utime=int(fields[11]),
                    stime=int(fields[12]), start_time=int(fields[19]),
                    arg_start=int(fields[45]) if len(fields) > 46 else None,
                    arg_end=int(fields[46]) if len(fields) > 46 else None)
    except ValueError:
        return None


def read(pid: int) -> Optional[Stat]:
    """Process ``pid``'s stat; None when it is gone (ENOENT, ESRCH while reaped) or unreadable."""
    try:
        fd = os.open(f"/proc/{int(pid)}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except (OSError, ValueError):
        return None
    try:
        raw = os.read(fd, MAX_BYTES)  # one read: procfs hands out the whole line at once
    except OSError:
        return None
    finally:
        os.close(fd)
    return parse(raw)


def environ(pid: int, limit: int = MAX_ENVIRON) -> Optional[List[bytes]]:
    """Process ``pid``'s environment as at exec, split at NUL (``b""`` last when it ends with one), at most
    ``limit`` bytes; None when it is gone or not ours to read."""
    try:
        with open(f"/proc/{int(pid)}/environ", "rb") as f:
            return f.read(limit).split(b"\0")
    except (OSError, ValueError):
        return None


def scan() -> Dict[int, Stat]:
    """Every process now, by pid (one pass over ``/proc``); those that exit meanwhile are left out."""
    try:
        with os.scandir("/proc") as entries:
            pids = [int(entry.name) for entry in entries if entry.name.isdigit()]
    except OSError:
        return {}
    table = {}
    for pid in pids:
        stat = read(pid)
        if stat is not None:
            table[pid] = stat
    return table
