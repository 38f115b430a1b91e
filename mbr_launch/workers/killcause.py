"""Who sent the signal that killed a worker, as precisely as this node can tell; never a guess.

In order: this launcher's own stop; the kernel's OOM killer (the memory cgroup's OOM count at the worker's start
and exit, and the kernel's ``Killed process PID`` record in ``/dev/kmsg``); else "unknown", with what was ruled
out. Faults a process raises itself are ``report.exitstatus``'s. Every read is bounded.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Collection, Sequence

from mbr_launch.report.exitstatus import ExitStatus, KillCause, Killer
from mbr_launch.visible import one_line

FAULTS = frozenset({"SIGSEGV", "SIGABRT", "SIGBUS", "SIGFPE", "SIGILL", "SIGTRAP", "SIGSYS"})
_SMALL = 64 * 1024  # bytes of a /proc or cgroup file read at most
KMSG_RECORDS = 50_000  # records of the kernel's log read at most for one exit
KMSG_SECONDS = 0.5  # and for at most this long
KMSG_SLACK = 60.0  # seconds a record may seem to predate the worker's start (the kernel's clock is not ours)
_SHOWN = 160


@dataclass(frozen=True)
class CgroupMark:
    """The worker's memory cgroup (a folder of the cgroup file system) and its OOM kill count then."""

    path: Path
    name: str  # the cgroup's own path, as /proc/PID/cgroup gives it
    oom_kills: int | None


def _read(path: str | Path) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(_SMALL).decode(errors="replace")
    except OSError:
        return None


def parse_mounts(mountinfo: str) -> list[tuple[str, str, str, str]]:
    """(fstype, superoptions, root, mount point) of each cgroup file system in a mountinfo text."""
    found = []
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        found.append((tail[0], tail[2], _unescape(fields[3]), _unescape(fields[4])))
    return found


def _unescape(path: str) -> str:
    return path.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def candidates(proc_cgroup: str, mounts: Sequence[tuple[str, str, str, str]]) -> list[tuple[Path, str]]:
    """Folders that may hold a process's memory counters, from its /proc/PID/cgroup text: v2, then v1 memory."""
    v2, v1 = None, None
    for line in proc_cgroup.splitlines():
        hier, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hier == "0" and controllers == "":
            v2 = path
        elif "memory" in controllers.split(","):
            v1 = path
    out = []
    for fstype, options, root, point in mounts:
        path = v2 if fstype == "cgroup2" else v1 if "memory" in options.split(",") else None
        if path is None or not path.startswith("/"):
            continue
        if root != "/":
            if not (path == root or path.startswith(root.rstrip("/") + "/")):
                continue
            path = path[len(root.rstrip("/")):] or "/"
        out.append((Path(point) / path.lstrip("/"), path))
    return out


def oom_kills(folder: Path) -> int | None:
    """The ``oom_kill`` count of a memory cgroup folder (v2 ``memory.events``, v1 ``memory.oom_control``)."""
    for name in ("memory.events", "memory.oom_control"):
        text = _read(folder / name)
        if text is None:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value.strip())
    return None


def mark(pid: int) -> CgroupMark | None:
    """The memory cgroup ``pid`` is in and its OOM kill count now; None when no counter can be read."""
    text, mounts = _read(f"/proc/{pid}/cgroup"), _read("/proc/self/mountinfo")
    if text is None or mounts is None:
        return None
    for folder, name in candidates(text, parse_mounts(mounts)):
        count = oom_kills(folder)
        if count is not None:
            return CgroupMark(folder, name, count)
    return None


def kernel_record(pid: int, *, since: float, records: Sequence[bytes] | None = None) -> str | None:
    """The kernel's ``Killed process PID (name)`` line for ``pid``, logged after ``since`` (``time.monotonic()``,
    close to the kernel's clock), or None."""
    needle = f"Killed process {pid} (".encode()
    for record in (records if records is not None else _kmsg()):
        head, _, message = record.partition(b";")
        parts = head.split(b",")
        if len(parts) < 3 or needle not in message:
            continue
        try:
            stamp = int(parts[2]) / 1e6
        except ValueError:
            continue
        if stamp + KMSG_SLACK >= since:
            line = message.split(b"\n", 1)[0].decode(errors="replace")
            return one_line(line.split(" total-vm", 1)[0].rstrip(", "), _SHOWN)
    return None


def _kmsg() -> list[bytes]:
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return []
    out: list[bytes] = []
    deadline = time.monotonic() + KMSG_SECONDS
    try:
        while len(out) < KMSG_RECORDS and time.monotonic() < deadline:
            try:
                out.append(os.read(fd, 8192))
            except BlockingIOError:
                break  # the end of the log
            except BrokenPipeError:
                continue  # records overwritten while reading: go on from the next
            except OSError:
                break
    finally:
        os.close(fd)
    return out


def cause(signal: str | None, *, sent: Collection[str], started: CgroupMark | None, oom_now: int | None,
          kernel: str | None) -> KillCause | None:
    """Who sent ``signal`` (None: not a signal, or one the process raises itself)."""
    if signal is None or signal in FAULTS:
        return None
    if signal in sent:
        before = list(sent)[:list(sent).index(signal)]
        grace = f" after {', '.join(before)} and its grace" if before else ""
        return KillCause(Killer.LAUNCHER, f"sent by this launcher's stop{grace}")
    if signal == "SIGKILL":
        if kernel:
            return KillCause(Killer.OOM, f"the kernel's OOM killer: '{kernel}'")
        rose = None if started is None or started.oom_kills is None or oom_now is None else oom_now - started.oom_kills
        if rose:
            return KillCause(Killer.OOM, f"the kernel's OOM killer: memory cgroup {started.name} counted {rose} OOM "  # type: ignore[union-attr]
                                         "kill(s) while this rank ran (the kernel's log, which names the victim, "
                                         "cannot be read here)")
        seen = f"no OOM kill counted in memory cgroup {started.name}" if rose == 0 and started else \
            "no memory cgroup OOM counter readable here"
        return KillCause(Killer.UNKNOWN, f"sender unknown: not this launcher's stop; {seen}")
    return KillCause(Killer.UNKNOWN, "sender unknown: not this launcher's stop")


def explain(pid: int, signal: str | None, *, sent: Collection[str], started: CgroupMark | None,
            since: float) -> KillCause | None:
    """``cause`` with the counter and the kernel's log read now, at the worker's exit; the log only for a
    SIGKILL the counter does not rule out."""
    if signal is None or signal in FAULTS or signal in sent or signal != "SIGKILL":
        return cause(signal, sent=sent, started=started, oom_now=None, kernel=None)
    now = oom_kills(started.path) if started else None
    ruled_out = started is not None and started.oom_kills is not None and now == started.oom_kills
    kernel = None if ruled_out else kernel_record(pid, since=since)
    return cause(signal, sent=sent, started=started, oom_now=now, kernel=kernel)


class Ledger:
    """By pid: the cgroup's OOM count at start and the signals stops sent; ``settle`` at exit names the sender."""

    def __init__(self) -> None:
        self._marks: dict[int, CgroupMark | None] = {}
        self._sent: dict[int, list[str]] = {}

    def started(self, pid: int) -> None:
        self._marks[pid] = mark(pid)

    def sent(self, pid: int, *signals: str) -> None:
        got = self._sent.setdefault(pid, [])
        got.extend(s for s in signals if s not in got)

    def settle(self, pid: int, status: ExitStatus | None, *, since: float) -> ExitStatus | None:
        started, sent = self._marks.pop(pid, None), self._sent.pop(pid, [])
        if status is None or status.signal is None or status.cause is not None:
            return status
        found = explain(pid, status.signal, sent=sent, started=started, since=since)
        return replace(status, cause=found) if found is not None else status
