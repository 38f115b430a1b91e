"""Straggler scores from step times: pure, no IO (NVRx's definitions, in ``--straggler-threshold``'s help).

The step time is each rank's own busy time (``shim.autobeat``): in synchronous training the step period is
the same for every rank, because the fast ones wait for the slow.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Iterable, Mapping


@dataclass(frozen=True)
class Score:
    relative: float
    individual: float
    median: float  # seconds, this interval
    best: float  # best interval median seen so far (this one included)
    samples: int

    def is_straggler(self, threshold: float) -> bool:
        return self.relative < threshold or self.individual < threshold


def scores(step_times: Mapping[int, Iterable[float]],
           best_medians: Mapping[int, float] | None = None) -> dict[int, Score]:
    """Scores of every rank with a step time; ``best_medians``: each rank's best of earlier intervals."""
    medians = {rank: (statistics.median(times), len(times)) for rank, times in
               ((rank, list(ts)) for rank, ts in step_times.items()) if times}
    if not medians:
        return {}
    fastest = min(m for m, _ in medians.values())
    out = {}
    for rank, (median, count) in medians.items():
        best = min(median, (best_medians or {}).get(rank, median))
        out[rank] = Score(relative=_ratio(fastest, median), individual=_ratio(best, median), median=median,
                          best=best, samples=count)
    return out


def _ratio(a: float, b: float) -> float:
    return 1.0 if b <= 0 else min(1.0, a / b)


@dataclass
class Report:
    interval: int
    scores: dict[int, Score]
    threshold: float

    @property
    def stragglers(self) -> list[int]:
        return sorted(r for r, s in self.scores.items() if s.is_straggler(self.threshold))

    def lines(self) -> list[str]:
        out = [f"straggler report #{self.interval} ({len(self.scores)} rank(s), threshold {self.threshold:g}): "
               + ", ".join(f"rank {r} {s.relative:.2f}/{s.individual:.2f}" for r, s in sorted(self.scores.items()))
               + "  (relative/individual)"]
        fastest = min((s.median for s in self.scores.values()), default=0.0)
        for rank in self.stragglers:
            s = self.scores[rank]
            out.append(f"STRAGGLER: rank {rank}: relative score {s.relative:.2f}, individual {s.individual:.2f} "
                       f"(median busy step {s.median * 1e3:.1f} ms vs fastest {fastest * 1e3:.1f} ms, own best "
                       f"{s.best * 1e3:.1f} ms)")
        return out

    def to_event(self) -> dict:
        return {"interval": self.interval, "threshold": self.threshold, "stragglers": self.stragglers,
                "ranks": [{"rank": r, "relative": round(s.relative, 4), "individual": round(s.individual, 4),
                           "median": round(s.median, 6), "best": round(s.best, 6), "samples": s.samples}
                          for r, s in sorted(self.scores.items())]}


@dataclass
class StragglerCheck:
    """Collects step times per rank; ``due(now)`` closes an interval (ranks with under ``min_samples`` left
    out) and returns its report."""

    interval: float
    threshold: float
    min_samples: int = 3
    started: float = 0.0
    times: dict[int, list[float]] = field(default_factory=dict)
    best: dict[int, float] = field(default_factory=dict)
    reports: int = 0

    def start(self, now: float) -> None:
        self.started = now
        self.times = {}

    def add(self, rank: int, times: Iterable[float]) -> None:
        self.times.setdefault(rank, []).extend(times)

    def next_due(self) -> float | None:
        return self.started + self.interval if self.interval > 0 else None

    def due(self, now: float) -> Report | None:
        if self.interval <= 0 or now < self.started + self.interval:
            return None
        enough = {r: t for r, t in self.times.items() if len(t) >= self.min_samples}
        self.start(now)
        if not enough:
            return None
        result = scores(enough, self.best)
        for rank, s in result.items():
            self.best[rank] = s.best
        self.reports += 1
        return Report(interval=self.reports, scores=result, threshold=self.threshold)
