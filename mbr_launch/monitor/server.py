"""The per-node rank monitor process: ``python -m mbr_launch.monitor.server``.

Driven by the agent over stdin/stdout (``wire.py``); NVRx clients connect to the per-rank sockets. The main
thread's ``epoll`` loop waits until the earliest timer; each client connection has a thread; ``Shared.lock``
guards all rank state. It reports expiries and the agent decides; it kills only when its agent is gone
(``agent_gone``). Never imports torch, NVRx, typer or rich.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time
from typing import Any, Callable

from mbr_launch.monitor import replies
from mbr_launch.monitor.connections import Connections
from mbr_launch.monitor.control import (ControlError, Emit, Emitter, LineReader, check_private_dir,
                                        configured_timeouts, int_field, opt_int_field, parse_socket_path,
                                        timeout_value)
from mbr_launch.monitor.deadlines import InvalidTransition, Phase, RankWatch
from mbr_launch.monitor.protocol import V06, V041
from mbr_launch.monitor.sockets import Sockets, StepBeats, Timers, drain, unlink
from mbr_launch.monitor.state import Shared, Slot, ranks_event
from mbr_launch.monitor.witness import hold_job_signals
from mbr_launch.monitor.wire import MonitorEvent, Op


# epoll cannot wait longer than about 24 days: a far deadline is waited for in steps.
MAX_WAIT = 3600.0


class MonitorServer:
    def __init__(self, emit: Emit, clock: Callable[[], float] = time.monotonic) -> None:
        self.shared = Shared(emit, clock)
        self.sockets = Sockets(self.shared.wake_r)
        self.connections = Connections(self.shared)
        self.beats = StepBeats(self.shared, self.sockets)
        self.timers = Timers(self.shared, self.beats)
        self.launcher_path = ""  # the workload-request socket, once configured
        self.ops: dict[str, Callable[[dict[str, Any]], None]] = {
            Op.CONFIGURE: self.configure, Op.ARM: self.arm, Op.PID: self.pid, Op.DISARM: self.disarm,
            Op.SNAPSHOT: self.snapshot, Op.EXIT: self.exit,
        }

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
                    self.handle(msg)
                except (ControlError, InvalidTransition, OSError) as exc:
                    op = msg.get("op") if isinstance(msg, dict) else None
                    self.shared.emit({"ev": MonitorEvent.ERROR, "message": str(exc), "op": op})
                if not self.shared.running:
                    return

    def agent_gone(self) -> None:
        """The agent died (lock held): SIGKILL the process group (else process) of every rank still armed."""
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
            for conn in list(self.connections.conns):
                self.connections.drop(conn)
            for slot in self.shared.slots.values():
                self.sockets.close_slot(slot)
            self.sockets.close_listeners()
            if self.launcher_path:
                unlink(self.launcher_path)
            threads = list(self.connections.threads)
        deadline = time.monotonic() + join_timeout
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self.sockets.ep.close()

    # ---- the agent's commands (``wire.Op``): main thread, lock held; bad input raises ControlError ----------

    def handle(self, msg: dict[str, Any]) -> None:
        op = msg.get("op")
        command = self.ops.get(op) if isinstance(op, str) else None
        if command is None:
            raise ControlError(f"unknown op {op!r}")
        if op not in (Op.CONFIGURE, Op.EXIT) and self.shared.cfg is None:
            raise ControlError(f"{op}: send configure first")
        command(msg)

    def configure(self, msg: dict[str, Any]) -> None:
        shared = self.shared
        if shared.cfg is not None:
            raise ControlError("configure: already configured")
        directory = check_private_dir(msg.get("dir"))
        given = msg.get("cfg") or {}
        if not isinstance(given, dict):
            raise ControlError("configure: cfg must be an object")
        user_set = given.get(replies.USER_SET, sorted(given))  # absent: every key given was set
        if not isinstance(user_set, list) or not all(isinstance(k, str) for k in user_set):
            raise ControlError(f"configure: {replies.USER_SET} must be a list of field names")
        # Absent keys: each client version's own defaults (replies.client_config); null: disabled.
        cfg = {**replies.CONFIG_DEFAULTS, **given, replies.USER_SET: user_set}
        try:
            for version in (V041, V06):  # validate before committing
                configured_timeouts(replies.client_config(cfg, version))
                replies.dumps(replies.ft_config(replies.client_config(cfg, version), version))  # encodable
        except (KeyError, ValueError, TypeError) as exc:
            raise ControlError(f"configure: bad cfg: {exc}") from None
        steps = msg.get("steps") or {}
        if not isinstance(steps, dict):
            raise ControlError("configure: steps must be an object")
        initial = timeout_value("steps.initial", steps.get("initial"))
        subsequent = timeout_value("steps.subsequent", steps.get("subsequent"))
        interval = timeout_value("steps.report_interval", steps.get("report_interval", 1.0))
        self.beats.timeouts, self.beats.report_interval = (initial, subsequent), interval or 1.0
        self.timers.set_status_interval(timeout_value("steps.status_interval", steps.get("status_interval")) or None)
        shared.dir, shared.cfg = directory, cfg
        self.launcher_path = os.path.join(directory, "launcher.sock")
        self.sockets.listen(self.launcher_path, None)
        shared.emit({"ev": MonitorEvent.READY, "launcher_socket": self.launcher_path})

    def arm(self, msg: dict[str, Any]) -> None:
        shared = self.shared
        local_rank = int_field(msg, "local_rank")
        path = parse_socket_path(msg.get("socket"), shared.dir)
        slot = shared.slots.get(local_rank)
        if slot is None:
            assert shared.cfg is not None
            # Armed with 0.4.1's view until a 0.6+ client's InitMsg switches it (connections._on_init).
            armed = configured_timeouts(replies.client_config(shared.cfg, V041))
            slot = shared.slots[local_rank] = Slot(local_rank, RankWatch(armed))
        self.connections.drop_slot(slot)
        if slot.listener is not None and slot.path != path:
            self.sockets.unlisten(slot)
        if slot.listener is None:
            slot.listener = self.sockets.listen(path, slot)
            slot.path = path
        slot.rank = opt_int_field(msg, "rank")
        slot.pid, slot.pgid = opt_int_field(msg, "pid"), opt_int_field(msg, "pgid")
        slot.client_pid = None
        shared.pids_known.notify_all()
        now = shared.clock()
        slot.watch.arm(now)
        self.beats.arm(slot, msg.get("step_socket"), now)
        shared.emit({"ev": MonitorEvent.ARMED, "local_rank": local_rank})

    def pid(self, msg: dict[str, Any]) -> None:
        slot = self._slot(msg)
        slot.pid, slot.pgid = opt_int_field(msg, "pid"), opt_int_field(msg, "pgid")
        self.shared.pids_known.notify_all()

    def disarm(self, msg: dict[str, Any]) -> None:
        slot = self._slot(msg)
        slot.watch.disarm()
        slot.steps.disarm()
        self.connections.drop_slot(slot)
        self.shared.emit({"ev": MonitorEvent.DISARMED, "local_rank": slot.local_rank})

    def snapshot(self, msg: dict[str, Any]) -> None:
        # Commands are read before the step sockets (``run``): the beats queued before this command count too.
        now = self.shared.clock()
        for slot in self.shared.sorted_slots():
            if slot.step_sock is not None:
                self.beats.read(slot, now)
        self.shared.emit(ranks_event(MonitorEvent.SNAPSHOT, self.shared.sorted_slots(), now))

    def exit(self, msg: dict[str, Any]) -> None:
        self.shared.running = False

    def _slot(self, msg: dict[str, Any]) -> Slot:
        local_rank = int_field(msg, "local_rank")
        slot = self.shared.slots.get(local_rank)
        if slot is None:
            raise ControlError(f"local rank {local_rank} was never armed")
        return slot


def main() -> int:
    # The job's signals never end the monitor (the agent owns its life): they stay pending (``monitor.witness``).
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
