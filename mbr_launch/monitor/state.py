"""The monitor's state: one ``Slot`` per local rank, one ``Conn`` per client connection, and ``Shared``,
what the main thread and the connection threads both touch. Everything here is guarded by ``Shared.lock``.

Below them, the payloads of the monitor's larger events (a rank's status row, expiries, timeout updates): pure
functions of a slot, read with the lock held. Times are rounded to the microsecond so lines stay short.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Optional

from mbr_launch.monitor import replies
from mbr_launch.monitor.control import Emit
from mbr_launch.monitor.deadlines import Expiry, RankWatch, next_deadline
from mbr_launch.monitor.protocol import UpdateConfig
from mbr_launch.monitor.steps import StepWatch
from mbr_launch.monitor.wire import STEP_KIND, MonitorEvent


@dataclass(eq=False, slots=True)  # eq=False: a connection is itself, in sets and dicts
class Conn:
    sock: socket.socket
    slot: Optional[Slot]  # None: a launcher-socket (workload request) connection
    peer_pid: int = 0  # the connecting process, as the kernel tells (SO_PEERCRED)
    dropped: bool = False  # detached from its slot; the serving thread closes the socket
    # NVRx 0.6+ skip_section_response: no reply read to heartbeats and sections (one would fill the socket).
    quiet: bool = False


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
        # A connection thread that moves a deadline earlier writes a byte here to wake the main thread.
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

    def effective_cfg(self, slot: Slot, version: str) -> dict[str, Any]:
        """The FaultToleranceConfig fields a client gets in reply to its InitMsg."""
        # As NVRx: a client initialising after an update gets the updated timeouts in its config.
        t = slot.watch.timeouts
        assert self.cfg is not None
        return {**replies.client_config(self.cfg, version), "initial_rank_heartbeat_timeout": t.initial,
                "rank_heartbeat_timeout": t.subsequent, "rank_section_timeouts": dict(t.sections),
                "rank_out_of_section_timeout": t.out_of_section}


def _age(now: float, since: Optional[float]) -> Optional[float]:
    return None if since is None else round(now - since, 6)


def describe(slot: Slot, now: float) -> dict[str, Any]:
    """One rank's row in ``snapshot`` and ``status`` events."""
    w, steps = slot.watch, slot.steps
    return {
        "local_rank": slot.local_rank,
        "rank": slot.rank,
        "pid": slot.pid,
        "state": w.phase.value,
        "connected": slot.active is not None,
        "last_heartbeat_age": _age(now, w.last_hb),
        "open_sections": list(w.open_sections),
        "heartbeats": w.heartbeats,
        "timeouts": asdict(w.timeouts),
        "steps": steps.steps,
        "step": steps.last_index,
        "last_step_age": _age(now, steps.last_at),
        "last_step_time": steps.last_period,
        "step_deadline_enforced": steps.armed and steps.enforced,
        "first_step_at": steps.first_at,
        "last_step_at": steps.last_at,
        "checkpoint_at": steps.checkpoint_at,
        "work_at": steps.work_at,  # the worker's collectives counted as training (autobeat's WORK mark)
        "progress": steps.progress,  # its first sign of progress (steps.PROGRESS_SIGNS); None: still starting
        "progress_at": steps.progress_at,
        "nvrx": slot.client_version,  # the generation of the rank's NVRx client ("0.4.1", "0.6+"), if any
        "iteration": w.iteration,  # the training iteration a 0.6+ client reports in "step" (Megatron)
        "first_iteration": w.first_iteration,  # ... the first of this session: where it (re)started
    }


def first_progress(slot: Slot, sign: str, now: float) -> dict[str, Any]:
    """A worker's first sign of progress other than a step or heartbeat (those have their own events)."""
    return {"ev": MonitorEvent.FIRST_PROGRESS, "local_rank": slot.local_rank, "rank": slot.rank, "kind": sign,
            "t": round(now - slot.watch.armed_at, 6), "monotonic": now}  # t: seconds since the worker's arm


def ranks_event(name: MonitorEvent, slots: list[Slot], now: float) -> dict[str, Any]:
    """A ``snapshot`` or ``status`` event: every rank's row, in local rank order."""
    return {"ev": name, "ranks": [describe(s, now) for s in slots]}


def expired(slot: Slot, now: float, expiry: Optional[Expiry] = None, *,
            step: Optional[tuple[float, float]] = None) -> dict[str, Any]:
    """A heartbeat or section deadline passed (``expiry``), or a step one (``step``: timeout, elapsed)."""
    w = slot.watch
    if expiry is not None:
        kind, section, timeout, elapsed = expiry.kind.value, expiry.section, expiry.timeout, expiry.elapsed
        since, extra = w.last_hb, {"iteration": w.iteration}
    else:
        assert step is not None
        (timeout, elapsed), kind, section = step, STEP_KIND, None
        since, extra = slot.steps.last_at, {"step": slot.steps.last_index}
    return {"ev": MonitorEvent.EXPIRED, "local_rank": slot.local_rank, "rank": slot.rank, "pid": slot.worker_pid(),
            "kind": kind, "section": section, "timeout": timeout, "elapsed": round(elapsed, 6),
            "open_sections": list(w.open_sections), "last_heartbeat_age": _age(now, since), **extra,
            "monotonic": now}


def timeouts_updated(slot: Slot, req: UpdateConfig) -> dict[str, Any]:
    """The client changed its timeouts (NVRx's calculated timeouts, or the script's own)."""
    hb, sec = req.hb, req.section
    return {"ev": MonitorEvent.TIMEOUTS_UPDATED, "local_rank": slot.local_rank,
            "hb": None if hb is None else asdict(hb), "section": None if sec is None else asdict(sec)}
