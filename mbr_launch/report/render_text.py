"""The run report in the terminal: per round and per failure what happened, then the timeline (one character
cell per slice of time, a glyph as well as a colour per kind), its legend, and each node's goodput. Log paths
are made visible here (the rest arrives visible), and nothing is read as markup or emoji codes.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import TextIO

from rich.console import Console
from rich.text import Text

from mbr_launch.decide.goodput_text import LABEL, MEANING, render
from mbr_launch.visible import one_line
from mbr_launch.report.timeline import OPEN, RUNNING, Failure, Lane, RunTimeline

GLYPH = {"startup": "░", "productive": "█", "lost": "▓", "detection": "!", "restart": "~", "other": "·",
         RUNNING: "=", OPEN: "?"}
STYLE = {"startup": "yellow", "productive": "green", "lost": "red", "detection": "magenta", "restart": "blue",
         "other": "grey50", RUNNING: "cyan", OPEN: "white"}
NAME = {**LABEL, RUNNING: "running", OPEN: "open"}
WHAT = {**MEANING, RUNNING: "workers ran; no optimizer step seen (no goodput to split)",
        OPEN: "no end in the log yet: an attempt still going, or cut off"}
LABEL_WIDTH = 22


def print_report(run: RunTimeline, stream: TextIO | None = None, width: int | None = None) -> None:
    console = Console(file=stream, width=width, highlight=False, soft_wrap=False, emoji=False, markup=False)
    # one print for all the lines: rich's cost is per call, and a log of many rounds tells a long story
    console.print("\n".join(story(run)), markup=False, soft_wrap=True)
    console.print()
    for row in timeline_rows(run, max(40, console.width)):
        console.print(row)
    console.print()
    for lane in run.lanes:
        text = render(lane.goodput)
        if text:
            head = f"{lane.label}: " if len(run.lanes) > 1 else ""
            console.print(head + text, markup=False, soft_wrap=True)


def story(run: RunTimeline) -> list[str]:
    """Plain lines: the run, then per round who failed, how and what it cost, and what came next."""
    nodes = {lane.label for lane in run.lanes}
    result = (f"exit code {run.exit_code}: {run.reason}" if run.exit_code is not None else run.reason)
    lines = [f"Run {run.run_id}, started {run.started}: {len(nodes)} node(s), {len(run.rounds)} round(s), "
             f"{len(run.failures)} failure(s), {run.wall:.1f} s",
             f"  {result}"]
    if run.argv:
        lines.append(f"  command: {' '.join(run.argv)}")
    for lane in run.lanes:
        lines.append(f"  log: {one_line(str(lane.path))}")
        lines.extend(f"    {note}" for note in lane.notes)
    by_number = {f.number: f for f in run.failures}
    for rnd in run.rounds:
        lines.append(f"round {rnd.index} at {rnd.t:.1f} s: {rnd.world_size} rank(s) on {rnd.nodes} node(s)"
                     f" (restart count {rnd.restart_count})")
        for number in rnd.failures:
            lines.extend(failure_lines(by_number[number]))
        lines.append(f"  then: {rnd.then}")
    listed = {n for rnd in run.rounds for n in rnd.failures}
    for f in run.failures:
        if f.number not in listed:  # outside any round on record (e.g. while joining one)
            lines.extend(failure_lines(f))
    return lines


def failure_lines(f: Failure) -> list[str]:
    where = f"rank {f.rank} (local rank {f.local_rank}) on {f.node}" if isinstance(f.rank, int) and f.rank >= 0 \
        else f.node
    status = f"exit code {f.exit_code}" if f.exit_code is not None else f"signal {f.signal}" if f.signal else ""
    lines = [f"  failure {f.number} at {f.t:.1f} s: {where}: {', '.join(x for x in (f.cause, status) if x)}; "
             f"last section: {f.section or '-'}"]
    if f.detail:
        lines.append(f"    {f.detail}")
    if f.cost:
        lines.append(f"    {f.cost}")
    return lines


def timeline_rows(run: RunTimeline, width: int) -> list[Text]:
    label_width = min(LABEL_WIDTH, max((len(lane.label) for lane in run.lanes), default=4))
    cells = max(10, width - label_width - 2)
    step = run.wall / cells if run.wall > 0 else 1.0
    rows = [Text("timeline (one cell = {:.2g} s)".format(step), style="bold")]
    for lane in run.lanes:
        row = Text(lane.label[:label_width].ljust(label_width) + "  ")
        ends = [s.end for s in lane.segments]
        for i in range(cells):
            kind = _kind_at(lane, ends, i * step, (i + 1) * step)
            row.append(GLYPH[kind] if kind else " ", style=STYLE[kind] if kind else "")
        rows.append(row)
    rows.append(Text(" " * (label_width + 2)) + _marks(run, cells, step))
    right = f"{run.wall:.1f} s"
    rows.append(Text(" " * (label_width + 2) + "0 s" + right.rjust(cells - 3)))
    for kind, seconds in run.seconds_by_kind().items():
        words = f" {NAME[kind]:<10}{seconds:7.1f} s  {WHAT[kind]}"
        if len(words) > width - 4:
            words = words[:width - 5] + "…"
        rows.append(Text("  ") + Text(GLYPH[kind] * 2, style=STYLE[kind]) + Text(words))
    return rows


def _kind_at(lane: Lane, ends: list[float], start: float, end: float) -> str | None:
    """The kind that covers most of [start, end); the segments lie end to end, so only those in the cell are
    looked at."""
    best, best_overlap = None, 0.0
    segments, i = lane.segments, bisect_right(ends, start)
    while i < len(segments) and segments[i].start < end:
        s, i = segments[i], i + 1
        overlap = min(end, s.end) - max(start, s.start)
        if overlap > best_overlap:
            best, best_overlap = s.kind, overlap
    return best


def _marks(run: RunTimeline, cells: int, step: float) -> Text:
    row = [" "] * cells
    for f in run.failures:
        mark = f"^{f.number}"
        col = max(0, min(cells - len(mark), int(f.t / step))) if step > 0 else 0
        for j, ch in enumerate(mark):
            if col + j < cells:
                row[col + j] = ch
    return Text("".join(row), style="bold red")
