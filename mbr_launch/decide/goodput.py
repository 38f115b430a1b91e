"""Goodput: how much of a run's wall time went into training steps that were kept. Pure, no IO.

Computed per node from its event log: one ``progress`` record per attempt ("segment": from the workers'
start to their stop; a rank- or node-scope restart starts a new one) and the ``end`` record. Times are the
log's ``t`` (seconds since launch). The run's wall time is split, without overlap or gap, into:

- startup: launch -> the first optimizer step of the first attempt (rendezvous, interpreter and torch start-up,
  model build, the first step itself with its compilation and data warm-up);
- productive: from an attempt's first step to its last step, minus lost work;
- lost: work a failure threw away. A plain script restarts from its beginning, so that is the failed
  attempt's whole stepping time; when the script marks its checkpoints with an NVRx section whose name starts
  with ``checkpoint``, ``ckpt`` or ``save``, or saves a dict with ``torch.save`` (seen by the automatic step
  heartbeat), only the steps after the last such checkpoint are lost;
- detection: a failed attempt's last step -> the failure was detected (for a hang, about the step timeout);
- restart: detection -> the first step of the next attempt (stop, back-off, rendezvous, start-up again);
- other: after the last step of a successful attempt (final save, teardown), and after the last attempt.

Per failure: its lost work, detection time and restart downtime. The fractions add up to 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

CATEGORIES = ("startup", "productive", "lost", "detection", "restart", "other")


@dataclass
class FailureCost:
    round: Any
    cause: str
    lost: float = 0.0
    detection: float = 0.0
    restart: float = 0.0


@dataclass
class Goodput:
    wall: float
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0.0))
    failures: list[FailureCost] = field(default_factory=list)
    steps: int = 0

    @property
    def fraction(self) -> float:
        return self.seconds["productive"] / self.wall if self.wall > 0 else 0.0

    def fractions(self) -> dict[str, float]:
        return {k: (v / self.wall if self.wall > 0 else 0.0) for k, v in self.seconds.items()}

    def render(self) -> str:
        if self.wall <= 0:
            return ""
        names = {"lost": "lost work", "detection": "failure detection"}
        lines = [f"Goodput: {self.fraction * 100:.1f}% ({self.seconds['productive']:.1f} s of productive steps in "
                 f"{self.wall:.1f} s, {self.steps} step(s) on local rank 0)",
                 "  " + ", ".join(f"{names.get(k, k)} {v:.1f} s ({v / self.wall * 100:.1f}%)"
                                  for k, v in self.seconds.items() if v > 0 or k == "productive")]
        for i, f in enumerate(self.failures, 1):
            lines.append(f"  failure {i} (round {f.round}, {f.cause}): lost {f.lost:.1f} s of work, detected "
                         f"{f.detection:.1f} s after the last step, training again {f.restart:.1f} s later")
        return "\n".join(lines)

    def to_event(self) -> dict[str, Any]:
        return {"wall": round(self.wall, 3), "goodput": round(self.fraction, 4),
                "seconds": {k: round(v, 3) for k, v in self.seconds.items()},
                "failures": [{"round": f.round, "cause": f.cause, "lost": round(f.lost, 3),
                              "detection": round(f.detection, 3), "restart": round(f.restart, 3)}
                             for f in self.failures]}


def compute(records: Iterable[dict[str, Any]], wall: float | None = None) -> Goodput:
    """``wall``: the run's length; default the ``end`` record's ``t`` (else the last record's)."""
    records = list(records)
    segments = sorted((r for r in records if r.get("event") == "progress"), key=lambda r: r["started"])
    if wall is None:
        ends = [r["t"] for r in records if r.get("event") == "end"]
        wall = ends[-1] if ends else max((r.get("t", 0.0) for r in records), default=0.0)
    g = Goodput(wall=wall)
    sec = g.seconds
    cursor = 0.0  # everything before it is accounted for
    pending: FailureCost | None = None  # the failure whose restart downtime is running
    for seg in segments:
        started, ended = _clip(seg["started"], cursor, wall), _clip(seg["ended"], seg["started"], wall)
        first, last = seg.get("first_step"), seg.get("last_step")
        waiting = "restart" if pending else "startup" if not g.steps and not g.failures else "other"
        # the gap before this segment, and its part before the first step
        until = _clip(first, started, ended) if first is not None else ended
        _add(sec, waiting, until - cursor, pending)
        cursor = until
        if first is not None and last is not None:
            last = _clip(last, until, ended)
            g.steps += int(seg.get("steps") or 0)
            pending = None
            if seg.get("cause") == "end":
                sec["productive"] += last - until
                sec["other"] += ended - last
            else:
                cost = FailureCost(round=seg.get("round"), cause=seg.get("cause_detail") or seg.get("cause", "?"))
                ckpt = seg.get("checkpoint")
                kept = _clip(ckpt, until, last) if ckpt is not None else until
                sec["productive"] += kept - until
                cost.lost, cost.detection = last - kept, ended - last
                sec["lost"] += cost.lost
                sec["detection"] += cost.detection
                g.failures.append(cost)
                pending = cost
            cursor = ended
        elif seg.get("cause") != "end":
            # failed before its first step: the time so far stays with the failure (or startup) before it
            _add(sec, waiting, ended - cursor, pending)
            cursor = ended
            pending = FailureCost(round=seg.get("round"), cause=seg.get("cause_detail") or seg.get("cause", "?"))
            g.failures.append(pending)
    _add(sec, "other", wall - cursor, None)  # after the last attempt: final stop, summary
    return g


def _add(sec: dict[str, float], category: str, seconds: float, failure: FailureCost | None) -> None:
    seconds = max(0.0, seconds)
    sec[category] += seconds
    if category == "restart" and failure is not None:
        failure.restart += seconds


def _clip(value: float, low: float, high: float) -> float:
    return max(low, min(high, value))
