"""Whose is the GPU memory: each process NVML names on the job's GPUs, as this job's (ended or running) or
a stranger's (docs/node-checks.md). ``classify`` is pure over NVML's answers, a process table and ``/proc``.
"""

from __future__ import annotations

import pwd
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Callable, Collection, Mapping, Sequence

from mbr_launch import procstat
from mbr_launch.health.nvml import GpuMemory
from mbr_launch.report.redact import shown_argv
from mbr_launch.visible import one_line
from mbr_launch.workers.strays import Proc, descendants

_COMMAND = 120  # characters of a command line put in a line
_ENVIRON = 1 << 20  # bytes of another process's environment read at most


class Owner(Enum):
    ENDED = "this job's, ended"  # the memory comes back when the driver has torn the process down: waited for
    JOB = "this job's"  # running (a standby, a worker of another agent of the job): not waited for
    STRANGER = "not of this job"


@dataclass(frozen=True)
class ProcInfo:
    user: str
    command: str
    environ: tuple[bytes, ...] = ()


@dataclass(frozen=True)
class Holder:
    device: str
    pid: int
    used_mb: float | None
    owner: Owner
    user: str = ""  # "" when the process cannot be seen from here
    command: str = ""
    visible: bool = True
    stopped: bool = False  # one of the stopped round's workers (reaped: its pid is not looked up again)

    def describe(self) -> str:
        mb = "?" if self.used_mb is None else f"{self.used_mb:.0f} MB"
        who = f"user {self.user}, `{self.command}`; " if self.visible else "" if self.stopped else \
            "not visible from here: exited, or in another PID namespace; "
        return f"pid {self.pid} ({who}{self.owner.value}) holds {mb} on GPU {self.device}"

    def to_event(self) -> dict[str, object]:
        return {"gpu": self.device, "pid": self.pid, "mb": self.used_mb, "owner": self.owner.name.lower(),
                "user": self.user, "command": self.command}


@dataclass(frozen=True)
class Job:
    me: int  # the launcher's pid
    run_id: str | None = None
    ended: frozenset[int] = frozenset()  # the stopped round's workers
    present_before: frozenset[int] = frozenset()  # pids on the GPUs before the round began


@dataclass(frozen=True)
class Reading:
    memories: tuple[GpuMemory, ...]
    holders: tuple[Holder, ...] = field(default_factory=tuple)

    def of(self, *owners: Owner) -> list[Holder]:
        return [h for h in self.holders if h.owner in owners]


def classify(memories: Sequence[GpuMemory], job: Job, table: Mapping[int, Proc],
             seen: Callable[[int], ProcInfo | None]) -> Reading:
    ours = {job.me} | descendants(dict(table), [job.me])
    mark = f"TORCHELASTIC_RUN_ID={job.run_id}".encode() if job.run_id else None
    holders = []
    for memory in memories:
        for process in memory.processes or ():
            pid = process.pid
            stopped = pid in job.ended
            look = None if stopped else seen(pid)  # reaped already: a process seen now under its pid is another
            if stopped:
                owner = Owner.ENDED
            elif look is None:
                owner = Owner.STRANGER if pid in job.present_before else Owner.ENDED
            elif pid in ours or (mark is not None and mark in look.environ):
                owner = Owner.JOB
            else:
                owner = Owner.STRANGER
            holders.append(Holder(memory.device, pid, process.used_mb, owner, user=look.user if look else "",
                                  command=look.command if look else "", visible=look is not None,
                                  stopped=stopped))
    return Reading(tuple(memories), tuple(holders))


def command_of(pid: int) -> str | None:
    """``pid``'s command line with secrets hidden (``[comm]`` when empty); None when ``/proc`` does not show it."""
    base = Path(f"/proc/{pid}")
    try:
        raw = (base / "cmdline").read_bytes()[:64 * 1024]
        text = shown_argv(raw.rstrip(b"\0").decode(errors="replace").split("\0")) if raw.strip(b"\0") else ""
        return text or f"[{(base / 'comm').read_text().strip()}]"
    except OSError:
        return None


def seen(pid: int) -> ProcInfo | None:
    """The user, command line and environment (empty for another user's) of ``pid``; None when not shown."""
    try:
        uid = Path(f"/proc/{pid}").stat().st_uid
    except OSError:
        return None
    if (command := command_of(pid)) is None:
        return None
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = str(uid)
    environ = tuple(procstat.environ(pid, _ENVIRON) or ())
    return ProcInfo(user, one_line(command, _COMMAND), environ)


def strangers_line(holders: Collection[Holder], *, shown: int = 8) -> str:
    """``pid 4242 (user bob, `python spin.py`; not of this job) holds 2383 MB on GPU 0; ...``"""
    listed = sorted(holders, key=lambda h: (h.device, -(h.used_mb or 0)))
    more = f"; and {len(listed) - shown} more" if len(listed) > shown else ""
    return "; ".join(h.describe() for h in listed[:shown]) + more
