"""Typed values that reach the supervisor loop from other threads and processes, decoded once at the edge
(``decode_monitor_event``): past this module no code looks an event up by a string key.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Mapping, Union

from mbr_launch import outside
from mbr_launch.cluster.inquiry import Opener
from mbr_launch.cluster.peers import PeerLost, PeersLeft, StoreLost
from mbr_launch.cluster.stops import StopMessage
from mbr_launch.monitor.wire import MonitorEvent


class Outcome(enum.Enum):
    SUCCEEDED = "succeeded"  # every node's workers finished
    RESTART = "restart"  # a new rendezvous round, decided by us or a peer
    FINAL = "final"  # the job ends: the stop message says why and with which code
    EXCLUDED = "excluded"  # this node leaves; the others go on
    SIGNALED = "signaled"  # a signal reached every node of the round (preemption or a stop request): the job ends
    LEFT = "left"  # a signal reached this node but not the whole round: this node leaves, the others go on


class Departure(enum.Enum):
    """How this agent parts from the rendezvous when it exits."""

    CLOSE = "close"  # the job is over: close it for every node
    LEAVE = "leave"  # this node is excluded, or was stopped alone: leave, the others go on
    NONE = "none"  # nothing to tell: closed already, or its store is unreachable


@dataclass(frozen=True)
class RoundResult:
    outcome: Outcome
    message: StopMessage | None = None  # RESTART / FINAL / EXCLUDED: the decision every node acts on
    signum: int | None = None  # SIGNALED, LEFT


# ---- events ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PeerStopped:
    """Another node (or this one, seen through the store) published the round's stop message."""

    message: StopMessage


@dataclass(frozen=True)
class AllDone:
    """Every node of the round reported its workers done."""


@dataclass(frozen=True)
class NodesWaiting:
    """Nodes wait to join the rendezvous: the round re-forms to admit them."""

    count: int


@dataclass(frozen=True)
class MonitorDied:
    """The rank monitor process exited: hang detection is lost until it is restarted."""

    exit_code: int | None


@dataclass(frozen=True)
class RankStarted:
    """A local rank showed its first sign of progress (``kind``: ``monitor.steps.PROGRESS_SIGNS``)."""

    local_rank: int
    first_step: Mapping[str, Any] | None = None  # the monitor's first_step record, for telemetry
    kind: str = "heartbeat"
    rank: int | None = None  # first_progress only: the global rank and seconds since the worker's start
    seconds: float | None = None


@dataclass(frozen=True)
class RankExpired:
    """A deadline of one rank passed (the monitor's verdict; the agent decides what it means)."""

    local_rank: int
    rank: int | None
    pid: int | None
    kind: str  # initial_heartbeat | heartbeat | section | out_of_section | step
    section: str | None = None
    timeout: float | None = None
    elapsed: float | None = None
    last_heartbeat_age: float | None = None
    open_sections: tuple[str, ...] = ()


@dataclass(frozen=True)
class InquiryOpened:
    """Another node opened a hang inquiry of this round: gather this node's evidence and join it."""

    opener: Opener


@dataclass(frozen=True)
class WorkloadRequest:
    """A worker sent NVRx ``WorkloadControlRequest`` (ShutdownWorkload, ExcludeThisNode, Continue)."""

    rank: int | None
    action: str
    description: str


@dataclass(frozen=True)
class MonitorWarning:
    """The rank monitor refused a connection or a request, or one broke: recorded, the job goes on."""

    message: str
    local_rank: int | None = None  # None: the launcher socket, or the monitor's control channel
    pid: int | None = None  # the connecting process, as the kernel tells


@dataclass(frozen=True)
class Progress:
    """Step beats and status rows: the monitor's record, read only by features that check each field."""

    kind: str
    payload: Mapping[str, Any] = field(default_factory=dict)


Event = Union[PeerStopped, PeerLost, PeersLeft, StoreLost, AllDone, NodesWaiting, MonitorDied, RankStarted, RankExpired,
              InquiryOpened, WorkloadRequest, MonitorWarning, Progress]


MAX_WARNING = 500  # characters of a monitor warning kept: the monitor quotes what peers sent


def decode_monitor_event(raw: Mapping[str, Any]) -> Event | None:
    """One line of the monitor's event stream -> a typed event; None for what the agent does not act on."""
    name = raw.get("ev")
    local_rank = outside.integer(raw.get("local_rank"))
    if name == MonitorEvent.FIRST_HEARTBEAT and local_rank is not None:
        return RankStarted(local_rank)
    if name == MonitorEvent.FIRST_STEP and local_rank is not None:
        return RankStarted(local_rank, first_step=raw, kind="step")
    if name == MonitorEvent.FIRST_PROGRESS and local_rank is not None:
        return RankStarted(local_rank, kind=str(raw.get("kind"))[:40], rank=outside.integer(raw.get("rank")),
                           seconds=outside.finite(raw.get("t")))
    if name in (MonitorEvent.STEPS, MonitorEvent.STATUS):
        return Progress(str(name), raw)
    if name == MonitorEvent.EXPIRED and local_rank is not None:
        sections = raw.get("open_sections")
        return RankExpired(local_rank=local_rank, rank=outside.integer(raw.get("rank")),
                           pid=outside.integer(raw.get("pid")), kind=str(raw.get("kind")),
                           section=raw.get("section") if isinstance(raw.get("section"), str) else None,
                           timeout=outside.finite(raw.get("timeout")), elapsed=outside.finite(raw.get("elapsed")),
                           last_heartbeat_age=outside.finite(raw.get("last_heartbeat_age")),
                           open_sections=tuple(str(s) for s in sections) if isinstance(sections, list) else ())
    if name == MonitorEvent.ERROR:
        return MonitorWarning(message=str(raw.get("message") or "(no message)")[:MAX_WARNING],
                              local_rank=local_rank, pid=outside.integer(raw.get("pid")))
    if name == MonitorEvent.WORKLOAD_REQUEST:
        return WorkloadRequest(rank=outside.integer(raw.get("rank")), action=str(raw.get("action")),
                               description=str(raw.get("description") or ""))
    return None
