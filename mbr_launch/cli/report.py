"""``mbr-launch report [RUN_DIR] [--svg FILE] [--html FILE]``: what happened in a run, and its timeline."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from mbr_launch.api import run_report
from mbr_launch.cli.process import CommandError
from mbr_launch.visible import one_line


def report_command(
    run_dir: Annotated[Optional[Path], typer.Argument(
        metavar="RUN_DIR", show_default=False,
        help="A run folder (the one a launch prints: 'logs and events in ...'), its events.jsonl, or a "
             "--log-dir (its latest run). Default: the latest run under the default log folder.")] = None,
    svg: Annotated[Optional[Path], typer.Option(
        "--svg", metavar="FILE", help="Also write the timeline as an SVG file (needs matplotlib).")] = None,
    html: Annotated[Optional[Path], typer.Option(
        "--html", metavar="FILE", help="Also write a standalone HTML page: the timeline and this report "
                                       "(needs matplotlib).")] = None,
) -> None:
    """Report a finished (or running) launch: each round and failure (rank, node, cause, exit code or
    signal, last section, detection and restart time), a timeline of start-up, training, lost work,
    detection and restart per node, and where the time went (goodput)."""
    from mbr_launch.report.render_plot import PlotUnavailable, html_page, require, svg as svg_text
    from mbr_launch.report.render_text import print_report
    from mbr_launch.report.runs import ReportError

    try:
        if svg or html:
            require()  # before any output: without it, the one line that says how to get it
        run = run_report(run_dir)
        print_report(run)
        for path, make in ((svg, svg_text), (html, html_page)):
            if path is not None:
                _write(path, make(run))
    except (ReportError, PlotUnavailable) as err:
        # one line, whatever it quotes: the paths it names are file names anyone sharing the folder chose
        raise CommandError(one_line(str(err))) from None


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text)
    except OSError as exc:
        raise CommandError(one_line(f"cannot write {path}: {exc.strerror or exc}")) from None
    print(f"wrote {one_line(str(path))}")
