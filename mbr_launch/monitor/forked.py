"""The rank monitor's process forked from the launcher, instead of started as a new interpreter.

A fork shares what the launcher has imported, where a new interpreter pays its start-up again (felt when many
agents share few cores). Taken only while the launcher runs a single thread (``api.launch`` forks before its
threads start); elsewhere ``MonitorLink`` starts a new interpreter. The child shows as
``mbr_launch.monitor.server: rank monitor of mbr-launch PID``, thread name ``mbr-monitor``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from typing import BinaryIO

from mbr_launch.forking import close_from, fork_launcher
from mbr_launch.monitor.wire import SERVER_MODULE

COMM = b"mbr-monitor"  # the child's thread name (at most 15 bytes)


class Forked:
    """The part of ``subprocess.Popen`` that ``MonitorLink`` uses, for a child this process forked."""

    def __init__(self, pid: int, stdin: BinaryIO, stdout: BinaryIO) -> None:
        self.pid = pid
        self.stdin = stdin
        self.stdout = stdout
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: it is gone, its status is not ours to know
                self.returncode = -1
                return self.returncode
            if pid == self.pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(SERVER_MODULE, timeout or 0.0)
            time.sleep(0.01)
        return code

    def kill(self) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def fork_monitor() -> Forked | None:
    """Fork the rank monitor; None where a fork is not safe here (more than one thread, or no ``os.fork``)."""
    commands_r, commands_w = os.pipe()
    events_r, events_w = os.pipe()
    launcher = os.getpid()
    pid = fork_launcher()
    if pid is None:
        for fd in (commands_r, commands_w, events_r, events_w):
            os.close(fd)
        return None
    if pid == 0:
        _child(commands_r, events_w, launcher)  # never returns
    os.close(commands_r)
    os.close(events_w)
    return Forked(pid, os.fdopen(commands_w, "wb"), os.fdopen(events_r, "rb"))


def _child(commands: int, events: int, launcher: int) -> None:
    code = 1
    try:
        os.setsid()  # as start_new_session: a Ctrl-C to the launcher's group does not reach the monitor
        os.dup2(commands, 0)
        os.dup2(events, 1)
        close_from(3)  # the launcher's ends of both pipes included: its death must read as EOF here
        from mbr_launch.shim.proctitle import retitle, set_name

        if retitle(f"{SERVER_MODULE}: rank monitor of mbr-launch {launcher}", name=COMM) is None:
            set_name(COMM)  # no title (no /proc/self/mem here): the name still tells it from the launcher
        from mbr_launch.monitor import server
        from mbr_launch.gcpause import resume_gc

        resume_gc()  # the launcher paused the collector for its imports; this process runs for days
        code = server.main()
    except BaseException:  # noqa: BLE001 - the child must end here, never return into the launcher's code
        try:
            import traceback

            traceback.print_exc()
        except BaseException:  # noqa: BLE001
            pass
    finally:
        os._exit(code)
