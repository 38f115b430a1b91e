"""Automatic step beats on the main thread: the per-rank datagram sockets and the ``steps`` reports.

``steps.py`` keeps each rank's step clock (pure); this module feeds it from the sockets and batches the
step times for the agent, at most one ``steps`` event per ``report_interval``. A worker's first step is a
``first_step`` event at once; its first checkpoint or collectives mark, when no step came before, a
``first_progress`` event: either tells the agent that the worker is past start-up.
"""

from __future__ import annotations

from typing import Any, Optional

from mbr_launch.monitor.control import parse_socket_path
from mbr_launch.monitor.sockets import Sockets
from mbr_launch.monitor.state import Shared, Slot
from mbr_launch.monitor.status import first_progress
from mbr_launch.monitor.steps import BEAT, mark_sign
from mbr_launch.monitor.wire import MonitorEvent


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
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
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
