"""The agent's commands (``wire.Op``), run on the main thread with the lock held.

Each command validates its message and raises ``ControlError`` on bad input; the server reports that as
an ``error`` event and goes on.
"""

from __future__ import annotations

import os
from typing import Any, Callable

from mbr_launch.monitor import replies
from mbr_launch.monitor.connections import Connections
from mbr_launch.monitor.control import (
    ControlError,
    check_private_dir,
    configured_timeouts,
    int_field,
    opt_int_field,
    parse_socket_path,
    timeout_value,
)
from mbr_launch.monitor.deadlines import RankWatch
from mbr_launch.monitor.protocol import V06, V041
from mbr_launch.monitor.sockets import Sockets, StepBeats, Timers
from mbr_launch.monitor.state import Shared, Slot, ranks_event
from mbr_launch.monitor.wire import MonitorEvent, Op

Command = Callable[[dict[str, Any]], None]


class Commands:
    def __init__(self, shared: Shared, sockets: Sockets, connections: Connections, beats: StepBeats,
                 timers: Timers) -> None:
        self.shared = shared
        self.sockets = sockets
        self.connections = connections
        self.beats = beats
        self.timers = timers
        self.launcher_path = ""  # the workload-request socket, once configured
        self.ops: dict[str, Command] = {
            Op.CONFIGURE: self.configure, Op.ARM: self.arm, Op.PID: self.pid, Op.DISARM: self.disarm,
            Op.SNAPSHOT: self.snapshot, Op.EXIT: self.exit,
        }

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
        # Absent keys: NVRx 0.4.1 defaults for 0.4.1 clients, each newer version's own for its clients (see
        # replies.client_config); null: disabled.
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
            # Until a client says which NVRx it is, the rank is armed with 0.4.1's view; a 0.6+ client's
            # InitMsg switches it to its own version's (connections._on_init).
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
        self.shared.emit(ranks_event(MonitorEvent.SNAPSHOT, self.shared.sorted_slots(), self.shared.clock()))

    def exit(self, msg: dict[str, Any]) -> None:
        self.shared.running = False

    def _slot(self, msg: dict[str, Any]) -> Slot:
        local_rank = int_field(msg, "local_rank")
        slot = self.shared.slots.get(local_rank)
        if slot is None:
            raise ControlError(f"local rank {local_rank} was never armed")
        return slot
