"""The monitor's state: one ``Slot`` per local rank, one ``Conn`` per client connection, and ``Shared``,
what the main thread and the connection threads both touch. Everything here is guarded by ``Shared.lock``.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any, Callable, Optional

from mbr_launch.monitor import replies
from mbr_launch.monitor.control import Emit
from mbr_launch.monitor.deadlines import RankWatch, next_deadline
from mbr_launch.monitor.steps import StepWatch


class Conn:
    __slots__ = ("sock", "slot", "dropped", "peer_pid", "quiet")

    def __init__(self, sock: socket.socket, slot: Optional[Slot], peer_pid: int = 0) -> None:
        self.sock = sock
        self.slot = slot  # None: a launcher-socket (workload request) connection
        self.dropped = False  # detached from its slot; the serving thread closes the socket
        self.peer_pid = peer_pid  # the connecting process, as the kernel tells (SO_PEERCRED)
        # An NVRx 0.6+ client with skip_section_response reads no reply to heartbeats and sections: writing
        # one would fill the socket buffer and block both sides after a few hundred messages.
        self.quiet = False


class Slot:
    """One local rank: its listening socket, its client connections and its deadlines."""

    def __init__(self, local_rank: int, watch: RankWatch) -> None:
        self.local_rank = local_rank
        self.rank: Optional[int] = None
        self.pid: Optional[int] = None
        self.pgid: Optional[int] = None
        self.path = ""
        self.listener: Optional[socket.socket] = None
        self.conns: set[Conn] = set()
        self.active: Optional[Conn] = None  # the connection whose InitMsg started this session
        self.client_pid: Optional[int] = None
        self.client_version: Optional[str] = None  # the NVRx generation of the last client to initialise
        self.watch = watch
        self.steps = StepWatch()
        self.step_sock: Optional[socket.socket] = None  # automatic step beats (datagrams), when armed with one
        self.step_path = ""

    def deadline(self) -> Optional[float]:
        d, s = next_deadline(self.watch), self.steps.deadline
        return s if d is None else d if s is None else min(d, s)

    def worker_pid(self) -> Optional[int]:
        """The pid the agent gave, else the one the client reported in its InitMsg."""
        return self.pid if self.pid is not None else self.client_pid


class Shared:
    """State of both the main thread and the connection threads; hold ``lock`` to read or write it."""

    def __init__(self, emit: Emit, clock: Callable[[], float] = time.monotonic) -> None:
        self.emit = emit  # called with the lock held: events never interleave
        self.clock = clock
        self.lock = threading.Lock()
        self.cfg: Optional[dict[str, Any]] = None  # None until the agent's ``configure``
        self.dir = ""
        self.slots: dict[int, Slot] = {}
        self.next_check: Optional[float] = None  # may be early (then we recompute), never late
        self.running = True
        # Notified when the agent tells a worker's pid: a connection that came first waits for it.
        self.pids_known = threading.Condition(self.lock)
        # A connection thread that moves a deadline earlier than the main thread's planned wake-up
        # writes a byte here; the main thread's epoll watches the read end.
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def check_by(self, deadline: Optional[float]) -> bool:
        """Plan a deadline check no later than ``deadline``; True if that moved the check earlier."""
        nc = self.next_check
        if deadline is not None and (nc is None or deadline < nc):
            self.next_check = deadline
            return True
        return False

    def wake(self) -> None:
        """Interrupt the main thread's wait (called without the lock)."""
        try:
            os.write(self.wake_w, b"\0")
        except BlockingIOError:
            pass  # the pipe is full of wake-ups already

    def sorted_slots(self) -> list[Slot]:
        return [slot for _, slot in sorted(self.slots.items())]

    def client_cfg(self, version: str) -> dict[str, Any]:
        """The FaultToleranceConfig fields a client of ``version`` starts from (before any update)."""
        assert self.cfg is not None
        return replies.client_config(self.cfg, version)

    def effective_cfg(self, slot: Slot, version: str) -> dict[str, Any]:
        """The FaultToleranceConfig fields a client gets in reply to its InitMsg."""
        # As NVRx: a client initialising after an update gets the updated timeouts in its config.
        t = slot.watch.timeouts
        return {**self.client_cfg(version), "initial_rank_heartbeat_timeout": t.initial,
                "rank_heartbeat_timeout": t.subsequent, "rank_section_timeouts": dict(t.sections),
                "rank_out_of_section_timeout": t.out_of_section}
