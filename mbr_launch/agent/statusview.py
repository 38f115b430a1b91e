"""The per-rank status display (``--status``): the rank monitor's status rows on the terminal. Rows in, text
out (``agent.features.telemetry`` keeps the rows). ``live`` is a rich table pinned below the worker output by
the console they share; ``plain`` a line of all ranks, printed only when it changed.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import io
import statistics
import sys
from typing import TYPE_CHECKING, Any, TextIO

from mbr_launch.report.console import Console, process_console
from mbr_launch.visible import one_line

if TYPE_CHECKING:
    from mbr_launch.config.model import LaunchConfig

LIVE_REFRESH = 0.5  # seconds between the monitor's status updates in live mode
PLAIN_WIDTH = 100  # a plain status line fits a terminal of this many columns, whatever the number of ranks
QUIET = 10.0  # seconds without a heartbeat or step after which the plain line names the quietest rank

Rows = dict[int, dict[str, Any]]  # local rank -> the monitor's last status row of it


class StatusView:
    def __init__(self, cfg: "LaunchConfig", *, now: float, stream: TextIO | None = None,
                 console: Console | None = None) -> None:
        self.stream = stream or sys.stderr
        # The live table is drawn by the console the worker output goes through (a given stream: none).
        self.console = console if console is not None else process_console() if stream is None else None
        terminal = self.console.is_terminal("stderr") if self.console else _isatty(self.stream)
        mode: str = cfg.output.status
        if mode == "auto" or (mode == "live" and not (terminal and self.console)):
            mode = "live" if terminal and self.console and cfg.monitor.enabled else "plain"
        self.mode = mode if cfg.monitor.enabled else "off"
        self.plain_interval = cfg.output.status_interval
        self.next_plain = now + self.plain_interval if self.mode == "plain" and self.plain_interval > 0 else None
        self._last_plain = ""  # the last plain line printed: an identical one is not printed again
        self._live = False
        self._colors: str | None = None

    def status_interval(self) -> float | None:
        """How often the monitor should send status rows for this display (None: never)."""
        interval = LIVE_REFRESH if self.mode == "live" else self.plain_interval if self.mode == "plain" else 0
        return interval or None

    def show(self, rows: Rows, starts: dict[int, int]) -> None:
        if self.mode == "live":
            self._draw_live(rows, starts)

    def plain_line(self, now: float, rows: Rows, starts: dict[int, int]) -> str | None:
        """The plain line to print now, if due and changed."""
        if self.next_plain is None or now < self.next_plain:
            return None
        self.next_plain = now + self.plain_interval
        line = status_line(rows, starts) if rows else ""
        if not line or line == self._last_plain:
            return None
        self._last_plain = line
        return line

    def close(self) -> None:
        if self._live and self.console is not None:
            self._live = False
            with contextlib.suppress(Exception):
                self.console.set_status(None)

    def _draw_live(self, rows: Rows, starts: dict[int, int]) -> None:
        try:
            if self._colors is None:
                from rich.console import Console as RichConsole

                self._colors = RichConsole(file=self.stream).color_system or ""
            # a copy: the console may draw it again (a new width) from a pump's thread
            rows, starts = {lr: dict(row) for lr, row in rows.items()}, dict(starts)
            assert self.console is not None
            self._live = self.console.set_status(functools.partial(_render, rows, starts, self._colors or None))
            if not self._live:
                self.mode = "off"
        except Exception:
            self.mode = "off"  # a display problem must never disturb the supervision


def table(rows: Rows, starts: dict[int, int]) -> Any:
    from rich.table import Table
    from rich.text import Text

    grid = Table(title="mbr-launch ranks", title_justify="left", expand=False)
    for name in ("local", "rank", "state", "heartbeat", "section", "step", "step time", "restarts"):
        grid.add_column(name, justify="right" if name not in ("state", "section") else "left")
    for _lr, row in sorted(rows.items(), key=lambda kv: kv[0] or 0):
        # Section names come from the workers: plain text (not rich markup) with no control character in it.
        grid.add_row(*(Text(one_line(cell)) for cell in _cells(row, starts)))
    return grid


def _render(rows: Rows, starts: dict[int, int], colors: str | None, width: int) -> list[str]:
    from rich.console import Console as RichConsole

    out = io.StringIO()
    RichConsole(file=out, width=width, force_terminal=True, color_system=colors,  # type: ignore[arg-type]
                highlight=False).print(table(rows, starts), crop=True)
    return out.getvalue().splitlines()


def _cells(row: dict[str, Any], starts: dict[int, int]) -> list[str]:
    age = _age(row)
    step_time = row.get("last_step_time")
    lr = row.get("local_rank")
    state = str(row.get("state", "?"))
    if state == "armed" and row.get("steps"):
        state = "stepping"  # no NVRx client, but automatic step beats
    return [str(lr), str(row.get("rank", "?")), state,
            "-" if age is None else f"{age:.1f} s ago", ",".join(row.get("open_sections") or []) or "-",
            _step_cell(row), "-" if step_time is None else f"{step_time * 1e3:.1f} ms",
            str(max(0, starts.get(lr, 1) - 1)) if isinstance(lr, int) else "0"]


def _step_cell(row: dict[str, Any]) -> str:
    """The iteration an NVRx 0.6+ client reports (it resumes from the checkpoint), else autobeat's steps."""
    iteration = row.get("iteration")
    if isinstance(iteration, int):
        return f"it {iteration}"
    return str(row.get("step") or 0)


def status_line(rows: Rows, starts: dict[int, int], width: int = PLAIN_WIDTH) -> str:
    """All ranks in one line that fits ``width``, the least telling parts left out first."""
    ranks = [r for _, r in sorted(rows.items(), key=lambda kv: kv[0] or 0)]
    states = collections.Counter(_cells(r, starts)[2] for r in ranks)
    n = len(ranks)
    head = f"{n} rank{'s' * (n != 1)}" + (f" {next(iter(states))}" if len(states) == 1 else
                                          ": " + ", ".join(f"{c} {s}" for s, c in states.most_common()))
    parts = [(0, head)]  # (rank: the highest is left out first, text), in the order shown
    restarts = max((starts.get(r.get("local_rank"), 1) - 1 for r in ranks), default=0)
    its = [r["iteration"] for r in ranks if isinstance(r.get("iteration"), int)]
    steps = [r["step"] for r in ranks if isinstance(r.get("step"), int)]
    if its:
        parts.append((1, f"iteration {max(its)}" if min(its) == max(its) else f"iteration {min(its)}-{max(its)}"))
    elif steps:
        since = " since the restart" if restarts > 0 else ""
        parts.append((1, (f"step {max(steps)}" if min(steps) == max(steps) else f"step {min(steps)}-{max(steps)}")
                      + since))
    times = {r.get("rank"): r["last_step_time"] for r in ranks if isinstance(r.get("last_step_time"), (int, float))}
    if times:
        typical = statistics.median(times.values())
        parts.append((4, f"{_seconds(typical)}/step"))
        slow = max(times, key=lambda k: times[k])
        if len(times) > 1 and times[slow] > 1.1 * typical:
            parts.append((5, f"slowest rank {slow} ({_seconds(times[slow])})"))
    sections = collections.Counter(s for r in ranks for s in r.get("open_sections") or [])
    if sections:
        parts.append((6, "sections: " + ", ".join(s if c == n else f"{s} {c}/{n}" for s, c in sections.most_common(3))))
    if restarts > 0:
        parts.append((3, f"restarts {restarts}"))
    ages = {r.get("rank"): _age(r) for r in ranks}
    quiet = max((k for k in ages if ages[k] is not None), key=lambda k: ages[k] or 0.0, default=None)
    if quiet is not None and (ages[quiet] or 0.0) >= QUIET:  # whole seconds: a stall prints anew, a healthy run not
        parts.append((2, f"rank {quiet} quiet for {ages[quiet]:.0f} s"))
    while True:
        line = "status: " + " · ".join(text for _, text in parts)
        if len(line) <= width or len(parts) == 1:
            return line[:width]
        parts.remove(max(parts))


def _age(row: dict[str, Any]) -> float | None:
    ages = [a for a in (row.get("last_heartbeat_age"), row.get("last_step_age")) if isinstance(a, (int, float))]
    return min(ages) if ages else None


def _seconds(t: float) -> str:
    return f"{t * 1e3:.0f} ms" if t < 1 else f"{t:.2f} s"


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
