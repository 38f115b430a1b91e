"""What the main thread does when its ``epoll`` wait times out: deadline checks and periodic reports.

The wait's timeout is the earliest of three times, so an expiry is reported about a millisecond after it
happens instead of on a poll interval: the next rank deadline, the next ``steps`` report, the next
``status`` event.
"""

from __future__ import annotations

from typing import Optional

from mbr_launch.monitor.beats import StepBeats
from mbr_launch.monitor.deadlines import Phase, next_expiry
from mbr_launch.monitor.state import Shared
from mbr_launch.monitor.status import expired, ranks_event, step_expired
from mbr_launch.monitor.wire import MonitorEvent


class Timers:
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
        """The earliest timer; read without the lock: a stale value is fine, as writers that move the
        deadline check earlier also wake the main thread."""
        nc = self.shared.next_check
        for ra in (self.beats.report_at, self.status_at):
            if ra is not None and (nc is None or ra < nc):
                nc = ra
        return nc

    def fire(self) -> None:
        """Run every timer that is due (lock held)."""
        clock = self.shared.clock
        nc = self.shared.next_check
        if nc is not None:
            now = clock()
            if now >= nc:
                self.check_deadlines(now)
        if self.beats.report_at is not None and clock() >= self.beats.report_at:
            self.beats.report()
        if self.status_at is not None and clock() >= self.status_at:
            assert self.status_interval is not None
            self.status_at = clock() + self.status_interval
            now = clock()
            if self.shared.slots:
                self.shared.emit(ranks_event(MonitorEvent.STATUS, self.shared.sorted_slots(), now))

    def check_deadlines(self, now: float) -> None:
        """Report every rank whose deadline has passed (one expiry per arm), and plan the next check."""
        earliest: Optional[float] = None
        for slot in self.shared.slots.values():
            w = slot.watch
            expiry = next_expiry(w, now)
            if expiry is not None:
                self.shared.emit(expired(slot, expiry, now))
                w.expire()
                slot.steps.expire()  # one expiry per arm
            step = slot.steps.expiry(now)
            if step is not None:
                self.shared.emit(step_expired(slot, step[0], step[1], now))
                slot.steps.expire()
                if w.phase is Phase.MONITORING:
                    w.expire()
            d = slot.deadline()
            if d is not None and (earliest is None or d < earliest):
                earliest = d
        self.shared.next_check = earliest
