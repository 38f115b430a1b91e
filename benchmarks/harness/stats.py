"""Medians, quartiles and ratios, and how the reports print them."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Summary:
    n: int
    median: float
    p25: float
    p75: float


def summarize(values: Sequence[float]) -> Summary | None:
    vals = sorted(values)
    if not vals:
        return None
    if len(vals) == 1:
        return Summary(1, vals[0], vals[0], vals[0])
    q = statistics.quantiles(vals, n=4, method="inclusive")
    return Summary(len(vals), statistics.median(vals), q[0], q[2])


def fmt_s(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f} s"


def fmt_iqr(s: Summary | None) -> str:
    return "-" if s is None else f"{s.p25:.3f} / {s.p75:.3f}"


def fmt_cell(s: Summary | None) -> str:
    """One table cell: median (p25 / p75)."""
    return "-" if s is None else f"{s.median:.3f} s ({s.p25:.3f} / {s.p75:.3f})"


def ratio(a: Summary | None, b: Summary | None) -> str:
    if a is None or b is None or b.median <= 0:
        return "-"
    return f"{a.median / b.median:.2f}x"


def paired_ratios(a: dict[int, float], b: dict[int, float]) -> Summary | None:
    """Per-trial a/b over trials where both succeeded (same trial = same machine load)."""
    return summarize([a[i] / b[i] for i in sorted(a.keys() & b.keys()) if b[i] > 0])
