"""The run's timeline as a standalone SVG or HTML file, drawn with matplotlib (the optional ``report`` extra).

Same model and colours as the terminal; ids ``segment-<kind>-<node>-<n>``, ``failure-<n>``, ``round-<n>`` let
tools find the elements. Run text is drawn with ``parse_math=False`` and ``text.usetex`` off (a ``$`` in a
name would be math mode; usetex would hand it to LaTeX).
"""

from __future__ import annotations

import html
import io
from typing import Any

from mbr_launch.decide.goodput_text import render
from mbr_launch.report.render_text import NAME, WHAT, story
from mbr_launch.report.timeline import KINDS, RunTimeline

INSTALL = "pip install 'mbr-launch[report]'"
COLOR = {"startup": "#e0b030", "productive": "#2ca02c", "lost": "#d62728", "detection": "#b04cc0",
         "restart": "#1f77b4", "other": "#a0a0a0", "running": "#17becf", "open": "#e8e8e8"}
FAILURE = "#800000"


class PlotUnavailable(Exception):
    """matplotlib is not installed: the message says how to get it."""


def require() -> Any:
    try:
        import matplotlib
        from matplotlib.figure import Figure  # noqa: F401  (fails too when the install is broken)
    except ImportError:
        raise PlotUnavailable(f"--svg and --html need matplotlib: {INSTALL}") from None
    return matplotlib


def svg(run: RunTimeline) -> str:
    mpl = require()
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    # text stays text (searchable, selectable); a fixed salt keeps the ids the same from run to run
    with mpl.rc_context({"svg.fonttype": "none", "svg.hashsalt": "mbr-launch", "text.usetex": False}):
        fig = Figure(figsize=(11, 2.2 + 0.5 * len(run.lanes)), layout="constrained")
        ax = fig.add_subplot()
        for y, lane in enumerate(run.lanes):
            for n, seg in enumerate(lane.segments):
                bars = ax.barh(y, seg.end - seg.start, left=seg.start, height=0.6, color=COLOR[seg.kind],
                               edgecolor="none")
                bars.patches[0].set_gid(f"segment-{seg.kind}-{y}-{n}")
        for rnd in run.rounds:
            ax.axvline(rnd.t, color="#606060", linestyle=":", linewidth=0.8, gid=f"round-{rnd.index}")
            ax.text(rnd.t, -0.55, f" round {rnd.index}", fontsize=8, color="#606060", va="bottom", parse_math=False)
        for f in run.failures:
            right = f.t > 0.75 * run.wall  # near the right edge: the label goes left of its line
            ax.axvline(f.t, color=FAILURE, linewidth=1.2, gid=f"failure-{f.number}")
            ax.text(f.t, len(run.lanes) - 0.45, f" {f.number}: rank {f.rank} {f.cause} ", fontsize=8,
                    color=FAILURE, va="top", ha="right" if right else "left", parse_math=False)
        ax.set_yticks(range(len(run.lanes)), [lane.label for lane in run.lanes], parse_math=False)
        ax.set_ylim(len(run.lanes) - 0.3, -0.7)
        ax.set_xlim(0, max(run.wall, 1e-3))
        ax.set_xlabel("seconds since launch")
        shown = run.seconds_by_kind()
        fig.legend(handles=[Patch(color=COLOR[k], label=f"{NAME[k]} {s:.1f} s") for k, s in shown.items()],
                   loc="outside lower center", ncols=min(len(shown), 7), frameon=False, fontsize=8)
        result = "exit code {}".format(run.exit_code) if run.exit_code is not None else "no end event"
        ax.set_title(f"mbr-launch run {run.run_id}: {len(run.failures)} failure(s), {result}", fontsize=10,
                     parse_math=False)
        out = io.StringIO()
        fig.savefig(out, format="svg")
    return out.getvalue()


def html_page(run: RunTimeline) -> str:
    drawing = svg(run)
    drawing = drawing[drawing.index("<svg"):]  # inline: no XML declaration or doctype inside the page
    goodput = "\n".join(f"{lane.label}: {render(lane.goodput)}" for lane in run.lanes if render(lane.goodput))
    legend = "".join(f"<tr><td><span class=key style=\"background:{COLOR[k]}\"></span>{html.escape(NAME[k])}</td>"
                     f"<td>{html.escape(WHAT[k])}</td></tr>" for k in KINDS)
    title = html.escape(f"mbr-launch run {run.run_id}")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em auto; max-width: 72em; padding: 0 1em; }}
pre {{ background: #f6f6f6; padding: 1em; overflow-x: auto; }}
svg {{ max-width: 100%; height: auto; }}
td {{ padding: 0.2em 1em 0.2em 0; vertical-align: top; }}
.key {{ display: inline-block; width: 1em; height: 1em; margin-right: 0.5em; vertical-align: middle; }}
</style></head><body>
<h1>{title}</h1>
{drawing}
<h2>What the segments mean</h2>
<table>{legend}</table>
<h2>What happened</h2>
<pre>{html.escape(chr(10).join(story(run)))}</pre>
<h2>Goodput</h2>
<pre>{html.escape(goodput)}</pre>
</body></html>
"""
