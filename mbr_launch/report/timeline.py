"""The run report's model: one run, per node and per round, on one time axis. Pure: records in, values out.

A node's lane is goodput's spans (the drawing and the summary are one accounting); a node that never saw an
optimizer step has its attempts drawn as ``running``, from ``progress`` records or its workers' lifetimes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable

from mbr_launch.decide.goodput import FailureCost, Goodput, compute
from mbr_launch.decide.goodput_text import failure_line
from mbr_launch.report.events import event_time
from mbr_launch.report.runs import NodeLog

RUNNING = "running"
OPEN = "open"  # after the last attempt on record, in a log without its end: an attempt still going (or cut off)
KINDS = ("startup", "productive", "lost", "detection", "restart", "other", RUNNING, OPEN)


@dataclass(frozen=True)
class Segment:
    kind: str  # one of KINDS
    start: float  # seconds on the run's axis
    end: float
    round: Any = None


@dataclass(frozen=True)
class Lane:  # one node's run
    label: str
    node: str
    group_rank: int | None
    path: Path
    offset: float  # its launch, on the run's axis
    segments: tuple[Segment, ...]
    goodput: Goodput
    exit_code: int | None  # None: no end event (still running, or killed)
    reason: str
    notes: tuple[str, ...] = ()  # what of its log the report left out (runs.NodeLog.notes)


@dataclass(frozen=True)
class Failure:
    number: int
    t: float  # when it was recorded, on the run's axis
    round: Any
    rank: Any
    local_rank: Any
    node: str
    cause: str
    exit_code: Any
    signal: Any
    section: Any
    detail: str
    cost: str  # lost work, detection and restart time, in goodput's words ("" when its node has no record)
    detection: float | None  # last step -> detected, when its attempt made steps
    restart: float | None  # detected -> training again, when a step came after it


@dataclass(frozen=True)
class RoundRow:
    """One rendezvous round of the run, as the report's round table lists it (all nodes together)."""

    index: Any
    t: float  # the first node's rendezvous, on the run's axis
    world_size: Any
    nodes: Any
    restart_count: Any
    failures: tuple[int, ...]  # Failure.number
    then: str  # what came after: "restart (job, back-off 1 s)", the end's reason, ...


@dataclass(frozen=True)
class RunTimeline:
    run_id: str
    started: str  # the earliest start event's ts
    wall: float
    lanes: tuple[Lane, ...]
    rounds: tuple[RoundRow, ...]
    failures: tuple[Failure, ...]
    exit_code: int | None
    reason: str
    argv: tuple[str, ...]

    def seconds_by_kind(self) -> dict[str, float]:
        """Seconds of each kind drawn, summed over the lanes, in ``KINDS`` order (kinds not drawn left out)."""
        segments = [s for lane in self.lanes for s in lane.segments]
        return {k: sum(s.end - s.start for s in segments if s.kind == k) for k in KINDS
                if any(s.kind == k for s in segments)}


def build(logs: Iterable[NodeLog]) -> RunTimeline:
    logs = list(logs)
    zeros = [event_time(log.records[0]) - float(log.records[0]["t"]) for log in logs]
    origin = min(zeros)
    lanes, failures, rounds_seen = [], [], {}
    for log, zero in zip(logs, zeros):
        offset = zero - origin
        lane = _lane(log, offset)
        lanes.append(lane)
        failures.extend(_failures(log.records, lane, offset))
        for r in log.records:
            if r["event"] == "rendezvous":
                rounds_seen.setdefault(r.get("round"), []).append((float(r["t"]) + offset, r))
    lanes.sort(key=lambda lane: (lane.group_rank is None, lane.group_rank or 0, lane.label))
    failures.sort(key=lambda f: f.t)
    failures = [replace(f, number=i) for i, f in enumerate(failures, 1)]
    records = [r for log in logs for r in log.records]
    ends = [lane for lane in lanes if lane.exit_code is not None]
    worst = max(ends, key=lambda lane: lane.exit_code or 0) if ends else None
    start = min((log.records[0] for log in logs), key=event_time)
    return RunTimeline(
        run_id=str(start.get("run_id")), started=str(start.get("ts")),
        wall=max((lane.offset + lane.goodput.wall for lane in lanes), default=0.0), lanes=tuple(lanes),
        rounds=tuple(_rounds(rounds_seen, failures, records, worst)), failures=tuple(failures),
        exit_code=worst.exit_code if worst else None,
        reason=worst.reason if worst else "no end event: still running, or the launcher was killed",
        argv=tuple(str(a) for a in start.get("argv") or ()))


def _lane(log: NodeLog, offset: float) -> Lane:
    records = log.records
    g = compute(records)
    if g.stepped:
        spans = [(s.kind, s.start, s.end, s.round) for s in g.spans]
    else:
        spans = _unstepped(records, g.wall)
    end = next((r for r in reversed(records) if r["event"] == "end"), None)
    if end is None and spans and spans[-1][0] == "other":
        kind, start, stop, rnd = spans[-1]
        spans[-1] = (OPEN, start, stop, rnd)  # not a wind-down: the log just has nothing after it yet
    group_ranks = [r.get("group_rank") for r in records if r.get("group_rank") is not None]
    node = str(records[0].get("node"))
    group_rank = group_ranks[0] if group_ranks else None
    return Lane(label=node if group_rank is None else f"{node} (node {group_rank})", node=node,
                group_rank=group_rank, path=log.path, offset=offset,
                segments=tuple(Segment(k, a + offset, b + offset, rnd) for k, a, b, rnd in spans if b > a),
                goodput=g, exit_code=end.get("exit_code") if end else None,
                reason=str(end.get("reason")) if end else "", notes=log.notes)


def _unstepped(records: list[dict[str, Any]], wall: float) -> list[tuple[str, float, float, Any]]:
    """Attempts without steps: ``running`` while workers lived, the gaps as start-up, restart and other."""
    attempts = [(float(r["started"]), float(r["ended"]), r.get("round")) for r in records if r["event"] == "progress"]
    if not attempts:  # no rank monitor: the workers' lifetimes by round
        by_round: dict[Any, list[float]] = {}
        for r in records:
            if r["event"] in ("worker_start", "worker_exit"):
                by_round.setdefault(r.get("round"), []).append(float(r["t"]))
        attempts = [(min(ts), max(ts), rnd) for rnd, ts in by_round.items() if len(ts) > 1]
    out, cursor = [], 0.0
    for started, ended, rnd in sorted(attempts, key=lambda a: a[0]):
        started, ended = max(cursor, min(started, wall)), max(cursor, min(ended, wall))
        out.append(("restart" if out else "startup", cursor, started, rnd))
        out.append((RUNNING, started, ended, rnd))
        cursor = ended
    out.append(("other", cursor, wall, None))
    return out


def _failures(records: list[dict[str, Any]], lane: Lane, offset: float) -> list[Failure]:
    costs: dict[Any, list[FailureCost]] = {}
    for cost in reversed(lane.goodput.failures):  # popped from the end: each round's first cost first
        costs.setdefault(cost.round, []).append(cost)
    out = []
    for r in records:
        if r["event"] != "failure":
            continue
        left = costs.get(r.get("round"))  # each cost used once: several ranks may fail in one round
        cost = left.pop() if left else None
        out.append(Failure(
            number=0, t=float(r["t"]) + offset, round=r.get("round"), rank=r.get("rank"),
            local_rank=r.get("local_rank"), node=str(r.get("node") or lane.node), cause=str(r.get("cause")),
            exit_code=r.get("exit_code"), signal=r.get("signal"), section=r.get("section"),
            detail=str(r.get("detail") or ""), cost=failure_line(cost) if cost else "",
            detection=cost.detection if cost and cost.stepped else None,
            restart=cost.restart if cost and cost.resumed else None))
    return out


def _rounds(seen: dict[Any, list[tuple[float, dict[str, Any]]]], failures: list[Failure],
            records: list[dict[str, Any]], worst: Lane | None) -> list[RoundRow]:
    restarts: dict[Any, dict[str, Any]] = {}
    for r in records:
        if r["event"] == "restart":
            restarts.setdefault(r.get("round"), r)
    numbers: dict[Any, list[int]] = {}
    for f in failures:
        numbers.setdefault(f.round, []).append(f.number)
    last = max(seen, key=lambda i: i if isinstance(i, int) else -1) if seen else None
    out = []
    for index in sorted(seen, key=lambda i: (not isinstance(i, int), i if isinstance(i, int) else 0)):
        t, first = min(seen[index], key=lambda pair: pair[0])
        restart = restarts.get(index)
        if restart is not None:
            backoff = restart.get("backoff") or 0
            then = f"restart {restart.get('restart_count')} of {restart.get('max_restarts')} " \
                   f"({restart.get('scope')} scope" + (f", back-off {backoff:g} s)" if backoff else ")")
        elif index == last:
            then = f"end: {worst.reason} (exit code {worst.exit_code})" if worst else "no end event"
        else:
            then = "next round (membership change)"
        out.append(RoundRow(index=index, t=t, world_size=first.get("world_size"),
                            nodes=first.get("group_world_size"), restart_count=first.get("restart_count"),
                            failures=tuple(numbers.get(index, ())), then=then))
    return out
