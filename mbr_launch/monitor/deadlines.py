"""Heartbeat and section deadlines of one rank: pure state, no IO, the clock passed in as ``now``.

Semantics follow NVRx 0.4.1 ``RankMonitorServer``, as deadlines instead of a periodic poll (the server sleeps
until the next one): the initial heartbeat timeout runs from client init to the first heartbeat, the
subsequent one from the last heartbeat; each open section runs its own timeout from its open, the
out-of-section one while none is open; ``None`` disables; an update replaces the timeouts at once, open
sections included; a section without a timeout can be opened and never expires. An NVRx 0.6+ session
(``init(newer=True)``) follows that version: no out-of-section timeout before the first "step" when sections
are configured without "warmup"; a "warmup" timeout times "step" for the first ``warmup_iterations`` reported
iterations; its version's default timeouts unless an update since the arm replaced them.

Lifecycle of a rank, one per ``arm`` from the agent (``arm`` from any state starts over)::

    DISARMED --arm--> ARMED --init--> MONITORING --deadline passed--> EXPIRED
                        ^                 |  ^  ^                       |  |
                        +---disconnect----+  |  +-- heartbeat, section, |  +-- messages acked, ignored
                                             |      update, re-init     |
                                             +--------- re-init --------+
    any state --disarm--> DISARMED

At most one expiry per client session; a re-init starts a new session (as NVRx's server resets its timers on
InitMsg): an NVRx in-process restart's ranks are watched again.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Mapping, Optional

Timeout = Optional[float]


class Phase(enum.Enum):
    ARMED = "armed"  # socket ready, no client initialised: no timers (as NVRx before InitMsg)
    MONITORING = "monitoring"
    EXPIRED = "expired"
    DISARMED = "disarmed"


class Trigger(enum.Enum):
    """What moves a rank's watch from one phase to the next (``TRANSITIONS``)."""

    ARM = "arm"
    INIT = "init"
    MESSAGE = "message"  # heartbeat, section, config update
    DISCONNECT = "disconnect"
    EXPIRE = "expire"
    DISARM = "disarm"


class InvalidTransition(Exception):
    def __init__(self, phase: Phase, trigger: Trigger) -> None:
        super().__init__(f"{trigger.value} is not valid in state {phase.value}")
        self.phase, self.trigger = phase, trigger


_P, _T = Phase, Trigger
TRANSITIONS: Mapping[tuple[Phase, Trigger], Phase] = {
    (_P.ARMED, _T.ARM): _P.ARMED,
    (_P.ARMED, _T.INIT): _P.MONITORING,
    (_P.ARMED, _T.DISCONNECT): _P.ARMED,  # a connection that closed before InitMsg
    (_P.ARMED, _T.DISARM): _P.DISARMED,
    (_P.MONITORING, _T.ARM): _P.ARMED,
    (_P.MONITORING, _T.INIT): _P.MONITORING,
    (_P.MONITORING, _T.MESSAGE): _P.MONITORING,
    (_P.MONITORING, _T.DISCONNECT): _P.ARMED,
    (_P.MONITORING, _T.EXPIRE): _P.EXPIRED,
    (_P.MONITORING, _T.DISARM): _P.DISARMED,
    (_P.EXPIRED, _T.ARM): _P.ARMED,
    (_P.EXPIRED, _T.INIT): _P.MONITORING,  # a new client session (in-process restart): watched again
    (_P.EXPIRED, _T.MESSAGE): _P.EXPIRED,
    (_P.EXPIRED, _T.DISCONNECT): _P.EXPIRED,
    (_P.EXPIRED, _T.DISARM): _P.DISARMED,
    (_P.DISARMED, _T.ARM): _P.ARMED,
    (_P.DISARMED, _T.DISARM): _P.DISARMED,
}


class Kind(str, enum.Enum):
    INITIAL_HEARTBEAT = "initial_heartbeat"
    HEARTBEAT = "heartbeat"
    SECTION = "section"
    OUT_OF_SECTION = "out_of_section"


@dataclass
class Timeouts:
    initial: Timeout = None
    subsequent: Timeout = None
    sections: dict[str, Timeout] = field(default_factory=dict)
    out_of_section: Timeout = None

    def copy(self) -> "Timeouts":
        return Timeouts(self.initial, self.subsequent, dict(self.sections), self.out_of_section)


@dataclass(frozen=True)
class Expiry:
    """A rank's expired deadline: which timeout ran out, and how long its span had run."""

    kind: Kind
    section: Optional[str]  # the section that timed out, for Kind.SECTION
    timeout: float
    elapsed: float  # how long the timed span had run at ``now``


class SectionError(Exception):
    """Open of an open section or close of a closed one: NVRx answers ErrorMsg with this cause."""


STEP, WARMUP = "step", "warmup"  # the section names NVRx 0.6+ gives a meaning


@dataclass
class RankWatch:
    configured: Timeouts
    phase: Phase = Phase.DISARMED
    timeouts: Timeouts = field(default_factory=Timeouts)
    updated: bool = False  # the client replaced the timeouts since the arm (UpdateConfigMsg)
    newer: bool = False  # this session's client is NVRx 0.6+: its rules apply
    warmup_iterations: int = 5
    first_iteration: Optional[int] = None  # of this session's "step" messages (0.6+ clients that report it)
    iteration: Optional[int] = None  # the latest one
    step_seen: bool = False  # "step" was opened in this session
    armed_at: float = 0.0
    init_at: Optional[float] = None
    last_hb: Optional[float] = None
    heartbeats: int = 0
    open_sections: dict[str, float] = field(default_factory=dict)  # name -> opened at
    oos_since: Optional[float] = None
    # Cached deadlines so the per-message cost does not grow with the number of timeouts configured.
    hb_deadline: Optional[float] = None
    sec_deadline: Optional[float] = None
    sec_deadline_name: Optional[str] = None  # None with sec_deadline set: out-of-section
    sec_timeout: Optional[float] = None  # the timeout behind sec_deadline ("warmup"'s for an early "step")

    def _go(self, trigger: Trigger) -> None:
        try:
            self.phase = TRANSITIONS[(self.phase, trigger)]
        except KeyError:
            raise InvalidTransition(self.phase, trigger) from None

    # ---- agent-driven -----------------------------------------------------------------------------------

    def arm(self, now: float) -> None:
        self._go(Trigger.ARM)
        self.timeouts = self.configured.copy()
        self.updated = False
        self.armed_at = now
        self._reset_session()
        self.first_iteration = self.iteration = None

    def disarm(self) -> None:
        self._go(Trigger.DISARM)
        self._reset_session()

    def expire(self) -> None:
        self._go(Trigger.EXPIRE)
        self.hb_deadline = self.sec_deadline = None

    # ---- client-driven ----------------------------------------------------------------------------------

    def init(self, now: float, *, newer: bool = False, warmup_iterations: int = 5,
             timeouts: Optional[Timeouts] = None) -> None:
        """A client session starts: ``newer`` (NVRx 0.6+) rules, its version's ``timeouts`` unless updated."""
        self._go(Trigger.INIT)
        self._reset_session()
        self.first_iteration = self.iteration = None
        self.newer, self.warmup_iterations = newer, warmup_iterations
        if timeouts is not None and not self.updated:
            self.timeouts = timeouts.copy()
        self.init_at = self.oos_since = now
        self._recompute_hb()
        self._recompute_sections()

    def disconnect(self) -> None:
        self._go(Trigger.DISCONNECT)
        if self.phase is Phase.ARMED:
            self._reset_session()

    def heartbeat(self, now: float) -> bool:
        """Record a heartbeat; True if it was the first one of this session."""
        if not self._message():
            return False
        self.last_hb = now
        self.heartbeats += 1
        sub = self.timeouts.subsequent
        self.hb_deadline = None if sub is None else now + sub
        return self.heartbeats == 1

    def open_section(self, name: str, now: float, iteration: Optional[int] = None) -> None:
        if not self._message():
            return
        self._note_iteration(name, iteration)
        if name in self.open_sections:
            raise SectionError(f"Section '{name}' is already open.")
        self.open_sections[name] = now
        self.oos_since = None
        if name == STEP:
            self.step_seen = True
        self._recompute_sections()

    def close_section(self, name: str, now: float, iteration: Optional[int] = None) -> None:
        if not self._message():
            return
        self._note_iteration(name, iteration)
        if name not in self.open_sections:
            raise SectionError(f"Section '{name}' is not open.")
        del self.open_sections[name]
        if not self.open_sections:
            self.oos_since = now
        self._recompute_sections()

    def close_all_sections(self, now: float) -> None:
        if not self._message():
            return
        self.open_sections.clear()
        self.oos_since = now
        self._recompute_sections()

    def update_timeouts(
        self,
        *,
        initial: Timeout = None,
        subsequent: Timeout = None,
        sections: Optional[Mapping[str, Timeout]] = None,
        out_of_section: Timeout = None,
        update_hb: bool,
        update_sections: bool,
    ) -> None:
        self._go(Trigger.MESSAGE)
        self.updated = self.updated or update_hb or update_sections
        if update_hb:
            self.timeouts.initial, self.timeouts.subsequent = initial, subsequent
        if update_sections:
            # NVRx replaces the whole mapping, it does not merge.
            self.timeouts.sections = dict(sections or {})
            self.timeouts.out_of_section = out_of_section
        if self.phase is Phase.MONITORING:
            self._recompute_hb()
            self._recompute_sections()

    # ---- internals --------------------------------------------------------------------------------------

    def _message(self) -> bool:
        """A heartbeat or section message; False after an expiry (acknowledged, ignored until a re-init)."""
        self._go(Trigger.MESSAGE)
        return self.phase is not Phase.EXPIRED

    def _reset_session(self) -> None:
        self.init_at = self.last_hb = self.oos_since = None
        self.heartbeats = 0
        self.open_sections.clear()
        self.hb_deadline = self.sec_deadline = self.sec_deadline_name = self.sec_timeout = None
        self.step_seen = False
        # The iterations outlive a disconnect and a disarm: the agent reads them after a rank's crash or end.

    def _note_iteration(self, name: str, iteration: Optional[int]) -> None:
        # As NVRx 0.6+: only "step" messages carry a trustworthy iteration; one that goes back is taken as is.
        if name == STEP and iteration is not None:
            if self.first_iteration is None:
                self.first_iteration = iteration
            self.iteration = iteration

    def section_limit(self, name: str) -> Timeout:
        """The timeout an open section ``name`` runs under now."""
        limits = self.timeouts.sections
        if (self.newer and name == STEP and WARMUP in limits and self.first_iteration is not None
                and self.iteration is not None and self.iteration - self.first_iteration < self.warmup_iterations):
            return limits[WARMUP]
        return limits.get(name)

    def out_of_section_limit(self) -> Timeout:
        """The out-of-section timeout now (none for 0.6+ before "step" when sections lack "warmup")."""
        limits = self.timeouts.sections
        if self.newer and limits and WARMUP not in limits and not self.step_seen:
            return None
        return self.timeouts.out_of_section

    def _recompute_hb(self) -> None:
        if self.last_hb is None:
            start, t = self.init_at, self.timeouts.initial
        else:
            start, t = self.last_hb, self.timeouts.subsequent
        self.hb_deadline = None if (t is None or start is None) else start + t

    def _recompute_sections(self) -> None:
        # O(open sections): a handful at most, and nothing else grows with traffic.
        best: Optional[float] = None
        best_name: Optional[str] = None
        best_t: Optional[float] = None
        if self.open_sections:
            for name, opened in self.open_sections.items():
                t = self.section_limit(name)
                if t is not None and (best is None or opened + t < best):
                    best, best_name, best_t = opened + t, name, t
        elif self.oos_since is not None and (t := self.out_of_section_limit()) is not None:
            best, best_t = self.oos_since + t, t
        self.sec_deadline, self.sec_deadline_name, self.sec_timeout = best, best_name, best_t


def next_deadline(w: RankWatch) -> Optional[float]:
    """The earliest monotonic time at which ``w`` could expire, or None if nothing is timed."""
    if w.phase is not Phase.MONITORING:
        return None
    return min((d for d in (w.hb_deadline, w.sec_deadline) if d is not None), default=None)


def next_expiry(w: RankWatch, now: float) -> Optional[Expiry]:
    """The timeout that has run out at ``now`` (the earliest, if several), else None."""
    deadline = next_deadline(w)
    if deadline is None or now < deadline:
        return None
    if w.hb_deadline is not None and w.hb_deadline == deadline:
        if w.last_hb is None:
            assert w.init_at is not None and w.timeouts.initial is not None
            return Expiry(Kind.INITIAL_HEARTBEAT, None, w.timeouts.initial, now - w.init_at)
        assert w.timeouts.subsequent is not None
        return Expiry(Kind.HEARTBEAT, None, w.timeouts.subsequent, now - w.last_hb)
    name, t = w.sec_deadline_name, w.sec_timeout
    assert t is not None
    if name is not None:
        return Expiry(Kind.SECTION, name, t, now - w.open_sections[name])
    assert w.oos_since is not None
    return Expiry(Kind.OUT_OF_SECTION, None, t, now - w.oos_since)
