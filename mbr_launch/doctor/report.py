"""Results for people (a rich table) and for machines (JSON with a stable schema), and the exit code."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

from mbr_launch.doctor.registry import SEVERITIES, CheckResult
from mbr_launch.report import exitcodes

if TYPE_CHECKING:
    from rich.console import Console

SCHEMA_VERSION = 1
NOT_RUN = exitcodes.DOCTOR_NOT_RUN  # no check could run (bad option or config): not 0/1/2, a check outcome
_STYLE = {"ok": "green", "warn": "yellow", "error": "bold red", "skip": "dim", "info": "cyan"}


def summary(results: Sequence[CheckResult]) -> dict[str, int]:
    return {sev: sum(r.severity == sev for r in results) for sev in SEVERITIES}


def exit_code(results: Sequence[CheckResult]) -> int:
    """0 all ok (skip and info included), 1 warnings, 2 errors."""
    counts = summary(results)
    return 2 if counts["error"] else 1 if counts["warn"] else 0


def to_json(results: Sequence[CheckResult]) -> str:
    return json.dumps(
        {
            "version": SCHEMA_VERSION,
            "checks": [{"id": r.id, "severity": r.severity, "title": r.title, "saw": r.saw, "fix": r.fix}
                       for r in results],
            "summary": summary(results),
        },
        indent=2,
    )


def to_json_error(message: str) -> str:
    """The JSON document when no check could run: the same schema, no checks, and the reason."""
    return json.dumps({"version": SCHEMA_VERSION, "error": message, "checks": [], "summary": summary([])}, indent=2)


def render_table(results: Sequence[CheckResult], console: Console) -> None:
    from rich.table import Table  # noqa: PLC0415 - keep JSON mode free of rich

    table = Table(title="mbr-launch doctor", show_lines=False, expand=False)
    table.add_column("check", no_wrap=True)
    table.add_column("", no_wrap=True)
    table.add_column("saw")
    table.add_column("fix")
    for r in results:
        style = _STYLE[r.severity]
        table.add_row(r.id, f"[{style}]{r.severity}[/]", r.saw, r.fix)
    console.print(table)
    counts = summary(results)
    console.print(", ".join(f"[{_STYLE[s]}]{n} {s}[/]" for s, n in counts.items() if n))


def render_problems(results: Sequence[CheckResult], console: Console) -> None:
    """The short form the launcher prints before starting: only warnings and errors, each with its fix."""
    for r in results:
        if r.severity in ("warn", "error"):
            console.print(f"[{_STYLE[r.severity]}]{r.severity}[/] {r.id}: {r.saw}")
            if r.fix:
                console.print(f"    fix: {r.fix}   (override: --skip-check {r.id})")
