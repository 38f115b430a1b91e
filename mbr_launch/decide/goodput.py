"""Goodput: how much of a run's wall time went into training steps that were kept. Pure, no IO.

Computed per node from its event log: one ``progress`` record per attempt (the workers' start to their stop)
and the ``end`` record, in the log's ``t``. The wall time is cut, without overlap or gap, into spans of the
six ``CATEGORIES`` (what each holds: docs/report.md, "Where the time went"); the seconds are their sums.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

CATEGORIES = ("startup", "productive", "lost", "detection", "restart", "other")


@dataclass(frozen=True)
class Span:
    """One stretch of a node's run; ``failure``: the index in ``Goodput.failures`` of the failure it costs."""

    kind: str
    start: float
    end: float
    round: Any = None
    failure: int | None = None


@dataclass
class FailureCost:
    round: Any
    cause: str
    lost: float = 0.0
    detection: float = 0.0
    restart: float = 0.0
    at: float = 0.0  # when it was detected (its attempt's end)
    stepped: bool = False  # its attempt made optimizer steps, so "after the last step" means something
    restarted: bool = False  # another attempt started after it
    resumed: bool = False  # ... and made a step: ``restart`` is the time until training went on
    reached: int | None = None  # the last iteration the failed attempt reported
    resumed_at: int | None = None  # the first one the next attempt reported

    @property
    def redone(self) -> int | None:
        """Iterations trained again because of this failure (None: none reported)."""
        if self.reached is None or self.resumed_at is None:
            return None
        return max(0, self.reached - self.resumed_at)


@dataclass
class Goodput:
    wall: float
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0.0))
    failures: list[FailureCost] = field(default_factory=list)
    steps: int = 0
    spans: list[Span] = field(default_factory=list)
    workers_started: float | None = None  # the first attempt's start: start-up before it is the launcher's

    @property
    def stepped(self) -> bool:
        return self.steps > 0 or any(s.kind in ("productive", "lost") for s in self.spans)

    @property
    def fraction(self) -> float:
        return self.seconds["productive"] / self.wall if self.wall > 0 else 0.0

    def fractions(self) -> dict[str, float]:
        return {k: (v / self.wall if self.wall > 0 else 0.0) for k, v in self.seconds.items()}

    def to_event(self) -> dict[str, Any]:
        return {"wall": round(self.wall, 3), "goodput": round(self.fraction, 4) if self.stepped else None,
                "seconds": {k: round(v, 3) for k, v in self.seconds.items()},
                "failures": [{"round": f.round, "cause": f.cause, "lost": round(f.lost, 3),
                              "detection": round(f.detection, 3), "restart": round(f.restart, 3),
                              "resumed": f.resumed, "iterations_redone": f.redone}
                             for f in self.failures]}


class _Cutter:
    """Lays spans end to end from a cursor; seconds and per-failure costs follow from the spans."""

    def __init__(self, g: Goodput) -> None:
        self.g, self.cursor = g, 0.0
        self._index: dict[int, int] = {}  # id(failure) -> its place in g.failures (append-only)

    def index(self, failure: FailureCost | None) -> int | None:
        """The failure's place in ``g.failures``, by identity (``list.index`` compares dataclasses: quadratic)."""
        if failure is None:
            return None
        failures = self.g.failures
        for i in range(len(self._index), len(failures)):
            self._index[id(failures[i])] = i
        return self._index.get(id(failure))

    def to(self, kind: str, until: float, rnd: Any = None, failure: FailureCost | None = None) -> None:
        start, self.cursor = self.cursor, max(self.cursor, until)
        if self.cursor <= start:
            return
        self.g.seconds[kind] += self.cursor - start
        index = self.index(failure)
        spans = self.g.spans
        if spans and spans[-1].kind == kind and spans[-1].failure == index and spans[-1].end == start:
            spans[-1] = Span(kind, spans[-1].start, self.cursor, spans[-1].round, index)  # one stretch, one span
        else:
            spans.append(Span(kind, start, self.cursor, rnd, index))
        if kind == "restart" and failure is not None:
            failure.restart += self.cursor - start


def compute(records: Iterable[dict[str, Any]], wall: float | None = None) -> Goodput:
    """``wall``: the run's length; default the ``end`` record's ``t`` (else the last record's)."""
    records = list(records)
    segments = sorted((r for r in records if r.get("event") == "progress"), key=lambda r: r["started"])
    if wall is None:
        ends = [r["t"] for r in records if r.get("event") == "end"]
        wall = ends[-1] if ends else max((r.get("t", 0.0) for r in records), default=0.0)
    g = Goodput(wall=wall)
    cut = _Cutter(g)
    pending: FailureCost | None = None  # the failure whose restart downtime is running
    unresumed = 0  # failures before this index have met an attempt that reported its first iteration
    for seg in segments:
        rnd = seg.get("round")
        started, ended = _clip(seg["started"], cut.cursor, wall), _clip(seg["ended"], seg["started"], wall)
        if g.workers_started is None:
            g.workers_started = started
        first_it = seg.get("first_iteration")
        if isinstance(first_it, int):
            for failure in g.failures[unresumed:]:  # every failure since the last attempt that reported one
                if failure.reached is not None and failure.resumed_at is None:
                    failure.resumed_at = first_it
            unresumed = len(g.failures)  # each failure is resumed by the first attempt after it that reports
        if pending is not None:
            pending.restarted = True
        first, last = seg.get("first_step"), seg.get("last_step")
        waiting = "restart" if pending else "startup" if not g.steps and not g.failures else "other"
        # the gap before this segment, and its part before the first step
        cut.to(waiting, _clip(first, started, ended) if first is not None else ended, rnd, pending)
        if first is not None and last is not None:
            first = cut.cursor
            last = _clip(last, first, ended)
            g.steps += int(seg.get("steps") or 0)
            if pending is not None:
                pending.resumed = True
            pending = None
            if seg.get("cause") == "end":
                cut.to("productive", last, rnd)
                cut.to("other", ended, rnd)
            else:
                cost = _failure(seg, ended, stepped=True)
                g.failures.append(cost)
                ckpt = seg.get("checkpoint")
                cut.to("productive", _clip(ckpt, first, last) if ckpt is not None else first, rnd)
                kept = cut.cursor
                cut.to("lost", last, rnd, cost)
                detected = _clip(seg.get("detected", ended), last, ended)
                cut.to("detection", detected, rnd, cost)
                cost.lost, cost.detection = last - kept, detected - last
                cut.to("restart", ended, rnd, cost)  # the kill grace and the stop
                pending = cost
        elif seg.get("cause") != "end":
            # failed before its first step: the time so far stays with the failure (or startup) before it
            cut.to(waiting, ended, rnd, pending)
            pending = _failure(seg, ended, stepped=False)
            g.failures.append(pending)
    cut.to("other", wall)  # after the last attempt: final stop, summary
    return g


def _failure(seg: dict[str, Any], ended: float, *, stepped: bool) -> FailureCost:
    reached = seg.get("last_iteration")
    return FailureCost(round=seg.get("round"), cause=seg.get("cause_detail") or seg.get("cause", "?"), at=ended,
                       stepped=stepped, reached=reached if isinstance(reached, int) else None)


def _clip(value: float, low: float, high: float) -> float:
    return max(low, min(high, value))
