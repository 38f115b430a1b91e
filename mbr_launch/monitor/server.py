"""The per-node rank monitor process: ``python -m mbr_launch.monitor.server``.

The agent drives it with JSON lines on stdin and reads events from stdout (``wire.py``); workers' unchanged
NVRx ``RankMonitorClient`` connect to the per-rank sockets the agent arms. The main thread runs an ``epoll``
loop over stdin, the sockets and a wake-up pipe, with the earliest timer as its timeout; each client
connection gets a thread; ``state.Shared.lock`` guards all rank state. The monitor reports expiries and the
agent decides; it kills only when its agent is gone (``agent_gone``). Never imports torch, NVRx, typer or rich.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time
from typing import Callable

from mbr_launch.monitor.commands import Commands
from mbr_launch.monitor.connections import Connections
from mbr_launch.monitor.control import ControlError, Emit, Emitter, LineReader
from mbr_launch.monitor.deadlines import InvalidTransition, Phase
from mbr_launch.monitor.sockets import Sockets, StepBeats, Timers, drain, unlink
from mbr_launch.monitor.state import Shared
from mbr_launch.monitor.witness import hold_job_signals
from mbr_launch.monitor.wire import MonitorEvent


# epoll cannot wait longer than about 24 days: a far deadline is waited for in steps.
MAX_WAIT = 3600.0


class MonitorServer:
    def __init__(self, emit: Emit, clock: Callable[[], float] = time.monotonic) -> None:
        self.shared = Shared(emit, clock)
        self.sockets = Sockets(self.shared.wake_r)
        self.connections = Connections(self.shared)
        self.beats = StepBeats(self.shared, self.sockets)
        self.timers = Timers(self.shared, self.beats)
        self.commands = Commands(self.shared, self.sockets, self.connections, self.beats, self.timers)

    def run(self, stdin_fd: int) -> None:
        shared, sockets, clock = self.shared, self.sockets, self.shared.clock
        reader = LineReader()
        sockets.ep.register(stdin_fd, select.EPOLLIN)
        while shared.running:
            wake_at = self.timers.wake_at()
            timeout = -1.0 if wake_at is None else min(MAX_WAIT, max(0.0, wake_at - clock()))
            try:
                events = sockets.ep.poll(timeout)
            except InterruptedError:
                continue
            # Commands first: an 'arm' the agent sent before it started a worker is handled before that
            # worker's connection, which may be in the same batch (``link.MonitorLink.arm``).
            for fd, _ in sorted(events, key=lambda event: event[0] != stdin_fd):
                if fd == shared.wake_r:
                    drain(fd)
                elif fd == stdin_fd:
                    self._control(stdin_fd, reader)
                elif fd in sockets.listeners:
                    with shared.lock:
                        self.connections.accept(*sockets.listeners[fd])
                elif fd in sockets.step_socks:
                    with shared.lock:
                        self.beats.read(sockets.step_socks[fd], clock())
            with shared.lock:
                self.timers.fire()

    def _control(self, fd: int, reader: LineReader) -> None:
        data = os.read(fd, 1 << 16)
        with self.shared.lock:
            if not data:
                self.sockets.ep.unregister(fd)
                self.agent_gone()
                return
            for msg in reader.feed(data):
                try:
                    if isinstance(msg, ControlError):
                        raise msg
                    self.commands.handle(msg)
                except (ControlError, InvalidTransition, OSError) as exc:
                    op = msg.get("op") if isinstance(msg, dict) else None
                    self.shared.emit({"ev": MonitorEvent.ERROR, "message": str(exc), "op": op})
                if not self.shared.running:
                    return

    def agent_gone(self) -> None:
        """The agent died (stdin EOF, or a broken stdout; lock held): nobody else is left to clean up, so SIGKILL
        the process group (else the process) of every rank still armed."""
        for slot in self.shared.slots.values():
            if slot.watch.phase is Phase.DISARMED:
                continue
            try:
                if slot.pgid is not None:
                    os.killpg(slot.pgid, signal.SIGKILL)
                elif slot.pid is not None:
                    os.kill(slot.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass  # already gone
        self.shared.running = False

    def close_all(self, join_timeout: float = 1.0) -> None:
        with self.shared.lock:
            self.connections.drop_all()
            for slot in self.shared.slots.values():
                self.sockets.close_slot(slot)
            self.sockets.close_listeners()
            if self.commands.launcher_path:
                unlink(self.commands.launcher_path)
            threads = list(self.connections.threads)
        deadline = time.monotonic() + join_timeout
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self.sockets.ep.close()


def main() -> int:
    # The signals that hit a whole job (Slurm's, a Ctrl-C) never end the monitor, whose life the agent owns; they
    # stay pending here, the agent's witness of a signal to the whole Slurm step (``monitor.witness``).
    hold_job_signals()
    emitter = Emitter(sys.stdout.fileno())
    monitor = MonitorServer(emitter.emit)
    emitter.on_broken = monitor.agent_gone
    try:
        monitor.run(sys.stdin.fileno())
    finally:
        monitor.close_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
