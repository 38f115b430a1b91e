"""Results for people (a rich table) and for machines (JSON with a stable schema), and the exit code."""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from mbr_launch.health.result import SEVERITIES, CheckResult
from mbr_launch.report import exitcodes

if TYPE_CHECKING:
    from rich.console import Console

SCHEMA_VERSION = 1
NOT_RUN = exitcodes.DOCTOR_NOT_RUN  # no check could run (bad option or config): not 0/1/2, a check outcome
_STYLE = {"ok": "green", "warn": "yellow", "error": "bold red", "skip": "dim", "info": "cyan"}
# A check id's prefix -> the heading its area is reported under.
AREAS = {"launcher": "Launcher", "rdzv": "Rendezvous", "gpu": "GPUs", "versions": "Versions", "limits": "Limits",
         "fs": "Files and disk", "config": "Config file", "ipr": "In-process restart", "deep": "Deep self-test"}


def summary(results: Sequence[CheckResult]) -> dict[str, int]:
    return {sev: sum(r.severity == sev for r in results) for sev in SEVERITIES}


def exit_code(results: Sequence[CheckResult]) -> int:
    """0 all ok (skip and info included), 1 warnings, 2 errors."""
    counts = summary(results)
    return 2 if counts["error"] else 1 if counts["warn"] else 0


def to_json(results: Sequence[CheckResult], versions: Mapping[str, str | None] | None = None, *,
            error: str | None = None) -> str:
    """The JSON document; ``error``: why no check could run (then ``results`` is empty)."""
    from mbr_launch.report.version import versions as installed  # noqa: PLC0415

    doc: dict[str, object] = {"version": SCHEMA_VERSION,
                              "versions": dict(versions) if versions is not None else installed()}
    if error is not None:
        doc["error"] = error
    doc["checks"] = [{"id": r.id, "severity": r.severity, "title": r.title, "saw": r.saw, "fix": r.fix}
                     for r in results]
    doc["summary"] = summary(results)
    return json.dumps(doc, indent=2)


def grouped(results: Sequence[CheckResult]) -> list[tuple[str, list[CheckResult]]]:
    """Results by area (the id's prefix), areas in the order their first check ran."""
    groups: dict[str, list[CheckResult]] = {}
    for r in results:
        prefix = r.id.split(".", 1)[0]
        groups.setdefault(AREAS.get(prefix, prefix), []).append(r)
    return list(groups.items())


def render_lines(results: Sequence[CheckResult], *, width: int, verbose: bool) -> list[tuple[str, str]]:
    """(style, text) lines of the report by area, wrapped to ``width``; skips folded into a line unless ``verbose``."""
    out: list[tuple[str, str]] = []
    for name, members in grouped(results):
        out.append(("bold", name))
        shown = [r for r in members if verbose or r.severity != "skip"]
        for r in shown:
            head = f"  {r.severity:<5} {r.id}: "
            for i, line in enumerate(_wrap(head + r.saw, width, 8)):
                out.append((_STYLE[r.severity] if i == 0 else "", line))
            if r.fix:
                out += [("", line) for line in _wrap(f"        fix: {r.fix}", width, 13)]
        folded = [r for r in members if r not in shown]
        if folded:
            # the gist of each skip: "no GPU (NVML init failed ...)" -> "no GPU"
            reasons = "; ".join(dict.fromkeys(r.saw.split(" (", 1)[0].strip() or r.saw for r in folded))
            out += [("dim", line) for line in _wrap(f"  {len(folded)} skipped ({reasons})", width, 4)]
    return out


def _wrap(text: str, width: int, indent: int) -> list[str]:
    return textwrap.wrap(text, max(width - 1, 40), subsequent_indent=" " * indent, break_on_hyphens=False,
                         break_long_words=True) or [text]


def render_table(results: Sequence[CheckResult], console: Console | None = None, *, verbose: bool = False,
                 title: str = "") -> None:
    from rich.console import Console  # noqa: PLC0415
    from rich.markup import escape  # noqa: PLC0415

    console = console or Console()
    width = min(console.width, 120)
    for line in _wrap(title, width, 2) if title else []:
        console.print(f"[bold]{escape(line)}[/]", highlight=False, soft_wrap=True)
    for style, line in render_lines(results, width=width, verbose=verbose):
        console.print(f"[{style}]{escape(line)}[/]" if style else escape(line), highlight=False, soft_wrap=True)
    counts = summary(results)
    told = ", ".join(f"[{_STYLE[s]}]{n} {'skipped' if s == 'skip' else s}[/]" for s, n in counts.items() if n)
    hint = " (--verbose shows the skipped checks)" if counts["skip"] and not verbose else ""
    console.print(told + hint, highlight=False, soft_wrap=True)


def preflight_line(results: Sequence[CheckResult]) -> str | None:
    """The launcher's lines for warnings, or None: each warning of a ``named`` check, then a count of the rest."""
    warned = [r for r in results if r.severity == "warn" and not r.named]
    named = [f"WARNING: {r.id}: {r.saw}" + (f" (fix: {r.fix})" if r.fix else "")
             for r in results if r.severity == "warn" and r.named]
    if warned:
        named.append(f"preflight: {len(warned)} {'other ' if named else ''}warning{'s' if len(warned) > 1 else ''}; "
                     "run `mbr-launch doctor` for details")
    return "\n".join(named) or None


def render_problems(results: Sequence[CheckResult], console: Console | None = None, *, quiet: bool = False) -> None:
    """What the launcher prints before starting: every error in full with its fix, warnings as one line (none
    with ``quiet``). rich is imported only for errors: every agent would pay for it before its ranks start."""
    errors = [r for r in results if r.severity == "error"]
    line = None if quiet else preflight_line(results)
    if not errors and not line:
        return
    if line and not errors and console is None:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
        return
    from rich.console import Console  # noqa: PLC0415
    from rich.markup import escape  # noqa: PLC0415

    console = console or Console(stderr=True)
    for r in errors:
        console.print(f"[{_STYLE[r.severity]}]{r.severity}[/] {escape(r.id)}: {escape(r.saw)}")
        if r.fix:
            console.print(f"    fix: {escape(r.fix)}   (override: --skip-check {escape(r.id)})")
    if line:
        console.print(escape(line), highlight=False, soft_wrap=True)
