"""The main thread's ``epoll``: the sockets it watches, the step beats it reads, and the timers its wait ends for.

Listeners (per rank, plus the launcher socket) and step-beat sockets, mode 0600 in the agent's private
directory. ``StepBeats`` feeds the step clocks and batches ``steps`` events; ``Timers`` ends the wait at the
next deadline, report or status, so an expiry is reported as it happens.
"""

from __future__ import annotations

import os
import select
import socket
from typing import Any, Optional

from mbr_launch.monitor.control import parse_socket_path
from mbr_launch.monitor.deadlines import Phase, next_expiry
from mbr_launch.monitor.state import Shared, Slot, expired, first_progress, ranks_event
from mbr_launch.monitor.steps import BEAT, mark_sign
from mbr_launch.monitor.wire import MonitorEvent


class Sockets:
    def __init__(self, wake_r: int) -> None:
        self.ep = select.epoll()
        self.ep.register(wake_r, select.EPOLLIN)
        self.listeners: dict[int, tuple[socket.socket, Optional[Slot]]] = {}  # fd -> (socket, rank or launcher)
        self.step_socks: dict[int, Slot] = {}  # fd -> rank

    def _bind(self, path: str, kind: int) -> socket.socket:
        unlink(path)  # a stale socket from an earlier monitor: the directory is private to the agent
        sock = socket.socket(socket.AF_UNIX, kind | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)
        sock.bind(path)
        os.chmod(path, 0o600)
        self.ep.register(sock.fileno(), select.EPOLLIN)
        return sock

    def _unbind(self, sock: socket.socket, path: str) -> None:
        try:
            self.ep.unregister(sock.fileno())
        except (OSError, ValueError):
            pass
        sock.close()
        unlink(path)

    def listen(self, path: str, slot: Optional[Slot]) -> socket.socket:
        sock = self._bind(path, socket.SOCK_STREAM)
        sock.listen(64)
        self.listeners[sock.fileno()] = (sock, slot)
        return sock

    def unlisten(self, slot: Slot) -> None:
        assert slot.listener is not None
        self.listeners.pop(slot.listener.fileno(), None)
        self._unbind(slot.listener, slot.path)
        slot.listener = None

    def open_steps(self, slot: Slot, path: str) -> None:
        slot.step_sock, slot.step_path = self._bind(path, socket.SOCK_DGRAM), path
        self.step_socks[slot.step_sock.fileno()] = slot

    def close_steps(self, slot: Slot) -> None:
        assert slot.step_sock is not None
        self.step_socks.pop(slot.step_sock.fileno(), None)
        self._unbind(slot.step_sock, slot.step_path)
        slot.step_sock, slot.step_path = None, ""

    def close_slot(self, slot: Slot) -> None:
        if slot.listener is not None:
            self.unlisten(slot)
        if slot.step_sock is not None:
            self.close_steps(slot)

    def close_listeners(self) -> None:
        """Close the listeners no rank owns (the launcher socket's); the caller unlinks their paths."""
        for sock, _ in list(self.listeners.values()):
            sock.close()
        self.listeners.clear()


def unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def drain(fd: int) -> None:
    """Empty a non-blocking pipe (the wake-up pipe: its bytes carry no meaning)."""
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


class StepBeats:
    """Lock held for every method: they run on the main thread and touch shared rank state."""

    def __init__(self, shared: Shared, sockets: Sockets) -> None:
        self.shared = shared
        self.sockets = sockets
        self.timeouts: tuple[Optional[float], Optional[float]] = (None, None)  # initial, subsequent
        self.report_interval = 1.0
        self.report_at: Optional[float] = None  # when pending step times go to the agent

    def arm(self, slot: Slot, path: Any, now: float) -> None:
        """Start the rank's step clock on the socket at ``path``; ``None``: no step beats for this worker."""
        slot.steps.forget_progress()  # a new worker, with or without beats
        if path is None:
            slot.steps.disarm()
            if slot.step_sock is not None:
                self.sockets.close_steps(slot)
            return
        path = parse_socket_path(path, self.shared.dir)
        if slot.step_sock is not None and slot.step_path != path:
            self.sockets.close_steps(slot)
        if slot.step_sock is None:
            self.sockets.open_steps(slot, path)
        else:
            self.read(slot, now, discard=True)  # beats of the previous worker
        slot.steps.initial, slot.steps.subsequent = self.timeouts
        slot.steps.arm(now)
        self.shared.check_by(slot.steps.deadline)

    def read(self, slot: Slot, now: float, discard: bool = False) -> None:
        sock = slot.step_sock
        assert sock is not None
        while True:
            try:
                data = sock.recv(64)
            except OSError:  # BlockingIOError included: nothing more queued
                return
            if discard or len(data) != BEAT.size:
                continue
            index, period, cpu, flags = BEAT.unpack(data)
            steps = slot.steps
            if steps.beat(now, index, period, cpu, flags):
                self.shared.emit({"ev": MonitorEvent.FIRST_STEP, "local_rank": slot.local_rank, "rank": slot.rank,
                                  "t": round(now - steps.armed_at, 6), "monotonic": now})
                # the first step replaces the initial timeout with the (usually much shorter) step timeout
                self.shared.check_by(steps.deadline)
            else:
                sign = mark_sign(flags)
                if sign is not None and steps.armed and steps.note_progress(sign, now):
                    self.shared.emit(first_progress(slot, sign, now))
            if self.report_at is None:
                self.report_at = now + self.report_interval

    def report(self) -> None:
        ranks = []
        for slot in self.shared.sorted_slots():
            report = slot.steps.take_report()
            if report is not None:
                ranks.append({"local_rank": slot.local_rank, "rank": slot.rank,
                              "nvrx_client": not slot.steps.enforced, **report})
        self.report_at = None
        if ranks:
            self.shared.emit({"ev": MonitorEvent.STEPS, "ranks": ranks})


class Timers:
    """What the main thread does when its wait times out: deadline checks and periodic reports (lock held)."""

    def __init__(self, shared: Shared, beats: StepBeats) -> None:
        self.shared = shared
        self.beats = beats
        self.status_interval: Optional[float] = None  # periodic status events for the agent's display
        self.status_at: Optional[float] = None

    def set_status_interval(self, interval: Optional[float]) -> None:
        self.status_interval = interval
        if interval:
            self.status_at = self.shared.clock() + interval

    def wake_at(self) -> Optional[float]:
        """The earliest timer, read without the lock (whoever moves a check earlier also wakes the loop)."""
        times = [t for t in (self.shared.next_check, self.beats.report_at, self.status_at) if t is not None]
        return min(times, default=None)

    def fire(self) -> None:
        clock, check = self.shared.clock, self.shared.next_check
        if check is not None and (now := clock()) >= check:
            self.check_deadlines(now)
        if self.beats.report_at is not None and clock() >= self.beats.report_at:
            self.beats.report()
        if self.status_at is not None and clock() >= self.status_at:
            assert self.status_interval is not None
            self.status_at = clock() + self.status_interval
            if self.shared.slots:
                self.shared.emit(ranks_event(MonitorEvent.STATUS, self.shared.sorted_slots(), clock()))

    def check_deadlines(self, now: float) -> None:
        """Report every rank whose deadline has passed (one expiry per arm), and plan the next check."""
        for slot in self.shared.slots.values():
            w = slot.watch
            expiry = next_expiry(w, now)
            if expiry is not None:
                self.shared.emit(expired(slot, now, expiry))
                w.expire()
                slot.steps.expire()  # one expiry per arm
            step = slot.steps.expiry(now)
            if step is not None:
                self.shared.emit(expired(slot, now, step=step))
                slot.steps.expire()
                if w.phase is Phase.MONITORING:
                    w.expire()
        deadlines = [d for slot in self.shared.slots.values() if (d := slot.deadline()) is not None]
        self.shared.next_check = min(deadlines, default=None)
