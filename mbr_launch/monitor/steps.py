"""Step deadlines and step-time records of one rank, fed by automatic step heartbeats: pure, no IO.

``initial`` runs from ``arm`` to the first step beat (``mbr_launch.shim.autobeat``), ``subsequent`` from each
step to the next; ``None`` disables. Once an NVRx client initialises (``yield_to_client``) beats only feed
records. ``FINISHED`` stops the clock until the next step; at most one expiry per arm. ``progress``: the
worker's first sign of progress (``PROGRESS_SIGNS``), told to the agent once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

# The beat datagram's layout (BEAT, read by sockets.py from here) and flags, shared with shim.autobeat.
from mbr_launch.contract import BEAT, CHECKPOINT, FINISHED, FIRST, WORK

# The signs of progress, as ``first_progress`` events and status rows name them.
STEP, HEARTBEAT, CHECKPOINT_SIGN, COLLECTIVES, ITERATION = "step", "heartbeat", "checkpoint", "collectives", "iteration"
PROGRESS_SIGNS = (STEP, HEARTBEAT, CHECKPOINT_SIGN, COLLECTIVES, ITERATION)


@dataclass
class StepWatch:
    initial: Optional[float] = None
    subsequent: Optional[float] = None
    armed: bool = False
    armed_at: float = 0.0
    enforced: bool = True  # False once an NVRx client owns the rank's liveness
    expired: bool = False
    steps: int = 0  # steps this arm: the worker's own counter, so a beat dropped by a full queue still counts
    last_index: int = 0  # the worker's own step counter, from the last beat
    first_at: Optional[float] = None
    last_at: Optional[float] = None
    last_period: Optional[float] = None
    checkpoint_at: Optional[float] = None  # last close of a checkpoint*/ckpt*/save* section, or torch.save
    deadline: Optional[float] = None
    work_at: Optional[float] = None  # the WORK beat: the worker had made enough collectives to be training
    progress: Optional[str] = None  # the worker's first sign of progress (PROGRESS_SIGNS), None: still starting
    progress_at: Optional[float] = None
    # Not yet reported to the agent: (step period, CPU seconds) of steps after the first.
    pending: list[tuple[float, float]] = field(default_factory=list)
    pending_first: bool = False  # the first step arrived since the last report
    pending_checkpoint: bool = False  # a checkpoint was marked since the last report

    def arm(self, now: float) -> None:
        self.armed, self.armed_at, self.enforced, self.expired = True, now, True, False
        self.steps = self.last_index = 0
        self.first_at = self.last_at = self.last_period = self.checkpoint_at = self.work_at = None
        self.forget_progress()
        self.pending = []
        self.pending_first = self.pending_checkpoint = False
        self.deadline = None if self.initial is None else now + self.initial

    def disarm(self) -> None:
        self.armed = False
        self.deadline = None
        self.pending = []

    def forget_progress(self) -> None:
        """A new worker: no sign of progress yet (``arm``; the monitor calls it for a worker without beats)."""
        self.progress = self.progress_at = None

    def note_progress(self, sign: str, now: float) -> bool:
        """Record a sign of progress; True if it is the worker's first (the one the agent is told of)."""
        if self.progress is not None:
            return False
        self.progress, self.progress_at = sign, now
        return True

    def yield_to_client(self) -> None:
        self.enforced = False
        self.deadline = None

    def beat(self, now: float, index: int, period: float, cpu: float, flags: int) -> bool:
        """Record one step (or mark); True if it was the first step of this arm."""
        if not self.armed:
            return False
        if flags & CHECKPOINT:
            self.checkpoint_closed(now)
            return False
        if flags & WORK:
            self.work_at = self.work_at or now
            return False
        if flags & FINISHED:
            self.deadline = None
            return False
        # The index is the worker's count of its steps since it started (after this arm): a starved monitor's
        # queue (10 datagrams by default) drops beats, never steps.
        self.steps = max(self.steps + 1, index)
        self.last_index, self.last_at = index, now
        first = self.first_at is None
        if first:
            self.first_at = now
            self.pending_first = True
            self.note_progress(STEP, now)
        if not (flags & FIRST):  # the first step's period includes the process start-up
            self.last_period = period
            self.pending.append((period, cpu))
        if self.enforced and not self.expired:
            self.deadline = None if self.subsequent is None else now + self.subsequent
        return first

    def checkpoint_closed(self, now: float) -> None:
        self.checkpoint_at = now
        self.pending_checkpoint = True

    def expiry(self, now: float) -> Optional[tuple[float, float]]:
        """(timeout, elapsed) when the step deadline has passed at ``now``, else None."""
        if self.deadline is None or now < self.deadline or self.expired or not self.enforced:
            return None
        if self.last_at is None:
            assert self.initial is not None
            return self.initial, now - self.armed_at
        assert self.subsequent is not None
        return self.subsequent, now - self.last_at

    def expire(self) -> None:
        self.expired = True
        self.deadline = None

    def take_report(self) -> Optional[dict[str, object]]:
        """What the agent has not seen yet (None if nothing), in the ``steps`` event's shape."""
        if not self.pending and not self.pending_first and not self.pending_checkpoint:
            return None
        periods = [round(p, 6) for p, _ in self.pending]
        cpu = [round(c, 6) for _, c in self.pending]
        self.pending = []
        self.pending_first = self.pending_checkpoint = False
        return {"steps": self.steps, "index": self.last_index, "periods": periods, "cpu": cpu,
                "first": self.first_at, "last": self.last_at, "checkpoint": self.checkpoint_at}


def mark_sign(flags: int) -> Optional[str]:
    """The sign of progress a beat that is not a step gives (a CHECKPOINT or WORK mark), else None."""
    if flags & CHECKPOINT:
        return CHECKPOINT_SIGN
    if flags & WORK:
        return COLLECTIVES
    return None


def is_checkpoint_section(name: str) -> bool:
    lowered = name.lower()
    return lowered.startswith(("checkpoint", "ckpt", "save"))
