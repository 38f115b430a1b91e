"""Descendants of workers that left the worker's process group: found, stopped with the workers, and reaped.

A child that called ``setsid()`` misses the group's signals. Strays are found under the live worker, or once
orphaned as the agent's (a subreaper) children it did not start with this run's ``TORCHELASTIC_RUN_ID`` in their
environment; each is held by pidfd (no recycled pid is hit). One that clears its environment and is orphaned
is not recognised: it lives on as under torchrun.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import time
from dataclasses import dataclass
from typing import Collection, Iterable

from mbr_launch import procstat

_PR_SET_CHILD_SUBREAPER = 36
STRAY_GRACE = 0.5  # seconds a stray gets after the first signal once the workers are gone, before SIGKILL


def become_subreaper() -> bool:
    """Make this process the parent of its orphaned descendants (Linux >= 3.4); False where unsupported."""
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


@dataclass(frozen=True)
class Proc:
    ppid: int
    pgid: int
    zombie: bool


def process_table() -> dict[int, Proc]:
    """Every process now (one pass over ``/proc``); those that exit meanwhile are left out."""
    return {pid: Proc(ppid=stat.ppid, pgid=stat.pgid, zombie=stat.zombie) for pid, stat in procstat.scan().items()}


def descendants(table: dict[int, Proc], roots: Iterable[int]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, proc in table.items():
        children.setdefault(proc.ppid, []).append(pid)
    found: set[int] = set()
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def orphans(table: dict[int, Proc], *, keep: Collection[int], run_id: str,
            local_ranks: Collection[int] | None) -> set[int]:
    """Live children of this process it did not start whose environment is a worker's of this run."""
    me, marker = os.getpid(), f"TORCHELASTIC_RUN_ID={run_id}".encode()
    ranks = None if local_ranks is None else {f"LOCAL_RANK={r}".encode() for r in local_ranks}
    found = set()
    for pid, proc in table.items():
        if proc.ppid != me or proc.zombie or pid in keep:
            continue
        env = procstat.environ(pid) or []
        if marker in env and (ranks is None or not ranks.isdisjoint(env)):
            found.add(pid)
    return found


def reap_zombies(keep: Collection[int]) -> int:
    """Wait for this process's dead children nobody else waits for (orphans handed to the subreaper)."""
    me, reaped = os.getpid(), 0
    for pid, proc in process_table().items():
        if proc.ppid == me and proc.zombie and pid not in keep:
            try:
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    reaped += 1
            except ChildProcessError:
                pass
    return reaped


class Strays:
    """The strays of one stop, held by pidfd; those outside the stopped groups are signalled here."""

    def __init__(self, groups: Collection[int]) -> None:
        self.groups = set(groups)
        self.fds: dict[int, int] = {}
        self.outside: set[int] = set()  # not in a stopped worker's group: the group signals miss them

    def add(self, table: dict[int, Proc], pids: Iterable[int]) -> None:
        for pid in pids:
            if pid in self.fds or pid not in table:
                continue
            try:
                self.fds[pid] = os.pidfd_open(pid)
            except OSError:  # gone already
                continue
            if table[pid].pgid not in self.groups:
                self.outside.add(pid)

    def signal(self, sig: int, *, everyone: bool = False) -> None:
        for pid, fd in self.fds.items():
            if everyone or pid in self.outside:
                try:
                    signal.pidfd_send_signal(fd, sig)
                except OSError:  # exited (ESRCH), or not ours to signal
                    pass

    def wait(self, timeout: float) -> bool:
        """Until every stray has exited (orphans reaped), at most ``timeout`` seconds; True when none is left."""
        deadline = time.monotonic() + timeout
        live = dict(self.fds)
        while live:
            poller = select.poll()  # not select(): the agent's descriptors may number past FD_SETSIZE
            for fd in live.values():
                poller.register(fd, select.POLLIN)
            ready = {fd for fd, _ in poller.poll(max(0.0, deadline - time.monotonic()) * 1000)}
            if not ready:
                break
            for pid in [pid for pid, fd in live.items() if fd in ready]:
                del live[pid]
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass  # not our child: its own parent reaps it
        return not live

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()
