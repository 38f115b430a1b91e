"""The agent's view of its ranks' progress: step beats in, straggler reports, goodput records and the
per-rank status display out.

``Telemetry`` is fed the rank monitor's ``first_step``, ``steps`` and ``status`` events by the agent loop and
ticked from it; it never blocks and starts no thread of its own. It keeps the current attempt ("segment") of
this node: when the first and last steps were made, the last checkpoint, how many steps; ``end`` writes that
as a ``progress`` event, from which ``goodput.compute`` splits the run's time.

Status display (``--status``): ``live`` is a rich table, one row per local rank (rank, state, age of the last
heartbeat or step, open sections, last step time, restarts), pinned at the bottom of the terminal by the
console that the worker output goes through (report/console.py: lines scroll above it, nothing is drawn
over), redrawn when the monitor sends a status update (twice a second); ``plain`` prints one summary line of
all ranks every ``--status-interval`` seconds, short whatever the number of ranks, and only when it differs
from the last one; ``auto`` is live on a terminal and plain otherwise.
"""

from __future__ import annotations

import collections
import functools
import io
import statistics
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, TextIO

from mbr_launch.decide.straggler import Report, StragglerCheck
from mbr_launch.report.console import Console, process_console

if TYPE_CHECKING:
    from mbr_launch.config.model import LaunchConfig
    from mbr_launch.report.events import EventLog

LIVE_REFRESH = 0.5  # seconds between the monitor's status updates in live mode
PLAIN_WIDTH = 100  # a plain status line fits a terminal of this many columns, whatever the number of ranks
QUIET = 10.0  # seconds without a heartbeat or step after which the plain line names the quietest rank


@dataclass
class Segment:
    round: int
    started: float  # monotonic
    first_step: float | None = None
    last_step: float | None = None
    checkpoint: float | None = None
    steps: int = 0
    # The training iterations an NVRx 0.6+ client reported in "step" (Megatron's): where the attempt started
    # (resumed) and the last one it reached. Real progress where the step count restarts from 0.
    first_iteration: int | None = None
    last_iteration: int | None = None


class Telemetry:
    def __init__(self, cfg: "LaunchConfig", log: "EventLog", say: Callable[[str], None], *,
                 clock: Callable[[], float] = time.monotonic, stream: TextIO | None = None,
                 snapshot: Callable[[], dict[str, Any] | None] | None = None,
                 console: Console | None = None) -> None:
        self.log, self.say, self.clock = log, say, clock
        self.snapshot = snapshot  # the monitor's snapshot: the latest steps, not yet reported in a batch
        t = cfg.telemetry
        self.enabled = bool(cfg.monitor.enabled and cfg.workers.use_boot and t.autobeat)
        self.step_timeouts = (t.initial_step_timeout, t.step_timeout)
        self.check = StragglerCheck(interval=t.straggler_interval, threshold=t.straggler_threshold)
        self.stop_on_straggler = t.stop_on_straggler
        self.segment: Segment | None = None
        self.starts: dict[int, int] = {}  # local rank -> times started
        self.rows: dict[int, dict[str, Any]] = {}  # local rank -> last status from the monitor
        self.stream = stream or sys.stderr
        # The live table is drawn by the console the worker output goes through (a given stream: none).
        self.console = console if console is not None else process_console() if stream is None else None
        terminal = self.console.is_terminal("stderr") if self.console else _isatty(self.stream)
        mode: str = cfg.output.status
        if mode == "auto" or (mode == "live" and not (terminal and self.console)):
            mode = "live" if terminal and self.console and cfg.monitor.enabled else "plain"
        self.mode = mode if cfg.monitor.enabled else "off"
        self.plain_interval = cfg.output.status_interval
        self.next_plain = clock() + self.plain_interval if self.mode == "plain" and self.plain_interval > 0 else None
        self._last_plain = ""  # the last plain line printed: an identical one is not printed again
        self._live = False
        self._colors: str | None = None

    # ---- what the monitor and the workers need --------------------------------------------------

    def monitor_config(self) -> dict[str, Any]:
        initial, subsequent = self.step_timeouts
        interval = LIVE_REFRESH if self.mode == "live" else self.plain_interval if self.mode == "plain" else 0
        return {"initial": initial, "subsequent": subsequent, "report_interval": 1.0,
                "status_interval": interval or None}

    # ---- segments ---------------------------------------------------------------------------------

    def begin(self, round_index: int, local_ranks: list[int]) -> None:
        """Workers (re)started: a new attempt; one still open ends as stopped (a peer's stop, a signal)."""
        now = self.clock()
        if self.segment is not None:
            self.end("stop")
        self.segment = Segment(round=round_index, started=now)
        for lr in local_ranks:
            self.starts[lr] = self.starts.get(lr, 0) + 1
        if self.check.next_due() is not None and not self.check.started:
            self.check.start(now)

    def end(self, cause: str, detail: str = "") -> None:
        seg, self.segment = self.segment, None
        if seg is None:
            return
        ended = self.clock()
        self._catch_up(seg)
        t = self.log.t_of
        self.log.emit("progress", round=seg.round, started=t(seg.started), ended=t(ended),
                      first_step=None if seg.first_step is None else t(seg.first_step),
                      last_step=None if seg.last_step is None else t(seg.last_step),
                      checkpoint=None if seg.checkpoint is None else t(seg.checkpoint), cause=cause,
                      steps=seg.steps, cause_detail=detail or None, first_iteration=seg.first_iteration,
                      last_iteration=seg.last_iteration)

    # ---- monitor events -----------------------------------------------------------------------------

    def _catch_up(self, seg: Segment) -> None:
        """Steps batched in the monitor but not yet reported (at most one report interval's worth), and the
        iterations NVRx clients reported (with or without autobeat)."""
        if self.snapshot is None:
            return
        try:
            snap = self.snapshot() or {}
        except Exception:
            return
        for entry in snap.get("ranks", []):
            first, last = entry.get("first_iteration"), entry.get("iteration")
            if isinstance(first, int) and isinstance(last, int):
                seg.first_iteration = first if seg.first_iteration is None else min(seg.first_iteration, first)
                seg.last_iteration = last if seg.last_iteration is None else max(seg.last_iteration, last)
            if not self.enabled:
                continue
            self._merge(seg, entry.get("first_step_at"), entry.get("last_step_at"), entry.get("checkpoint_at"))
            if entry.get("local_rank") == 0 and entry.get("steps"):
                seg.steps = max(seg.steps, int(entry["steps"]))

    @staticmethod
    def _merge(seg: Segment, first: Any, last: Any, checkpoint: Any) -> None:
        if isinstance(first, (int, float)) and first >= seg.started:
            seg.first_step = first if seg.first_step is None else min(seg.first_step, first)
        if isinstance(last, (int, float)) and last >= seg.started:
            seg.last_step = max(seg.last_step or last, last)
        if isinstance(checkpoint, (int, float)) and checkpoint >= seg.started:
            seg.checkpoint = max(seg.checkpoint or checkpoint, checkpoint)

    def on_first_step(self, event: dict[str, Any]) -> None:
        seg = self.segment
        mono = event.get("monotonic")
        if seg is not None and isinstance(mono, (int, float)):
            seg.first_step = mono if seg.first_step is None else min(seg.first_step, mono)
            seg.last_step = max(seg.last_step or mono, mono)
        if seg is not None:
            self.log.emit("first_step", round=seg.round, rank=event.get("rank"), local_rank=event.get("local_rank"),
                          seconds=event.get("t"))

    def on_steps(self, event: dict[str, Any]) -> None:
        seg = self.segment
        for entry in event.get("ranks", []):
            rank, lr = entry.get("rank"), entry.get("local_rank")
            if isinstance(rank, int):
                self.check.add(rank, entry.get("cpu") or [])
            row = self.rows.setdefault(lr, {"local_rank": lr, "rank": rank})
            if entry.get("periods"):
                row["last_step_time"] = entry["periods"][-1]
            row["step"] = entry.get("index")
            if seg is None:
                continue
            self._merge(seg, entry.get("first"), entry.get("last"), entry.get("checkpoint"))
            if lr == 0 or not seg.steps:
                seg.steps = max(seg.steps, int(entry.get("steps") or 0))

    def on_status(self, event: dict[str, Any]) -> None:
        for entry in event.get("ranks", []):
            self.rows.setdefault(entry.get("local_rank"), {}).update(entry)
        if self.mode == "live":
            self._draw_live()

    # ---- the loop's timer ---------------------------------------------------------------------------

    def next_tick(self) -> float | None:
        times = [t for t in (self.check.next_due() if self.check.started else None, self.next_plain) if t is not None]
        return min(times) if times else None

    def tick(self, round_index: int) -> Report | None:
        """Due work: a straggler report (returned, already printed and logged), a plain status line."""
        now = self.clock()
        report = self.check.due(now) if self.check.started else None
        if report is not None:
            for line in report.lines():
                self.say(line)
            self.log.emit("straggler", round=round_index, **report.to_event())
        if self.next_plain is not None and now >= self.next_plain:
            self.next_plain = now + self.plain_interval
            line = status_line(self.rows, self.starts) if self.rows else ""
            if line and line != self._last_plain:
                self._last_plain = line
                self.say(line)
        return report

    def close(self) -> None:
        if self._live and self.console is not None:
            self._live = False
            try:
                self.console.set_status(None)
            except Exception:
                pass

    # ---- rendering ----------------------------------------------------------------------------------

    def table(self) -> Any:
        return _table(self.rows, self.starts)

    def _draw_live(self) -> None:
        try:
            if self._colors is None:
                from rich.console import Console as RichConsole

                self._colors = RichConsole(file=self.stream).color_system or ""
            # a copy: the console may draw it again (a new width) from a pump's thread
            rows, starts = {lr: dict(row) for lr, row in self.rows.items()}, dict(self.starts)
            assert self.console is not None
            self._live = self.console.set_status(functools.partial(_render, rows, starts, self._colors or None))
            if not self._live:
                self.mode = "off"
        except Exception:
            self.mode = "off"  # a display problem must never disturb the supervision


def _table(rows: dict[int, dict[str, Any]], starts: dict[int, int]) -> Any:
    from rich.table import Table

    table = Table(title="mbr-launch ranks", title_justify="left", expand=False)
    for name in ("local", "rank", "state", "heartbeat", "section", "step", "step time", "restarts"):
        table.add_column(name, justify="right" if name not in ("state", "section") else "left")
    for _lr, row in sorted(rows.items(), key=lambda kv: kv[0] or 0):
        table.add_row(*_cells(row, starts))
    return table


def _render(rows: dict[int, dict[str, Any]], starts: dict[int, int], colors: str | None, width: int) -> list[str]:
    from rich.console import Console as RichConsole

    out = io.StringIO()
    RichConsole(file=out, width=width, force_terminal=True, color_system=colors,  # type: ignore[arg-type]
                highlight=False).print(_table(rows, starts), crop=True)
    return out.getvalue().splitlines()


def _cells(row: dict[str, Any], starts: dict[int, int]) -> list[str]:
    age = row.get("last_heartbeat_age")
    step_age = row.get("last_step_age")
    if step_age is not None and (age is None or step_age < age):
        age = step_age
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
    """The optimizer steps autobeat counted, else the iteration an NVRx 0.6+ client reports (Megatron's)."""
    iteration = row.get("iteration")
    if not row.get("step") and isinstance(iteration, int):
        return f"it {iteration}"
    return str(row.get("step") or 0)


def status_line(rows: dict[int, dict[str, Any]], starts: dict[int, int], width: int = PLAIN_WIDTH) -> str:
    """All ranks in one line that fits ``width``: "status: 8 ranks monitoring · step 120 · 310 ms/step · slowest
    rank 3 (450 ms) · sections: step · restarts 1". The least telling parts are left out when it is too long."""
    ranks = [r for _, r in sorted(rows.items(), key=lambda kv: kv[0] or 0)]
    states = collections.Counter(_cells(r, starts)[2] for r in ranks)
    n = len(ranks)
    head = f"{n} rank{'s' * (n != 1)}" + (f" {next(iter(states))}" if len(states) == 1 else
                                          ": " + ", ".join(f"{c} {s}" for s, c in states.most_common()))
    parts = [(0, head)]  # (rank: the highest is left out first, text), in the order shown
    steps = [r["step"] for r in ranks if isinstance(r.get("step"), int)]
    if steps:
        parts.append((1, f"step {max(steps)}" if min(steps) == max(steps) else f"step {min(steps)}-{max(steps)}"))
    its = [r["iteration"] for r in ranks if isinstance(r.get("iteration"), int)]
    if its:
        parts.append((1, f"iteration {max(its)}" if min(its) == max(its) else f"iteration {min(its)}-{max(its)}"))
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
    restarts = max((starts.get(r.get("local_rank"), 1) - 1 for r in ranks), default=0)
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
