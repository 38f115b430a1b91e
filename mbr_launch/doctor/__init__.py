"""``mbr-launch doctor``: named preflight checks (ok / warn / error, what was seen, the fix). The CLI and the
launcher call ``DoctorContext.from_values``, ``run_checks``, ``run_doctor`` and ``preflight``; no typer here.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from mbr_launch.doctor.checks import check_ids, check_skip, run_checks
from mbr_launch.doctor.context import DoctorContext
from mbr_launch.doctor.processes import detect_launcher
from mbr_launch.doctor.registry import CheckResult, DoctorError
from mbr_launch.doctor.report import NOT_RUN, exit_code, render_problems, render_table, to_json

if TYPE_CHECKING:
    from rich.console import Console

__all__ = [
    "CheckResult", "DoctorContext", "DoctorError", "check_ids", "check_skip", "detect_launcher", "exit_code",
    "NOT_RUN", "preflight", "render_table", "run_checks", "run_doctor", "to_json",
]


def run_doctor(
    ctx: DoctorContext, *, deep: bool, as_json: bool, skip: Iterable[str] = frozenset(), console: Console | None = None,
    verbose: bool = False,
) -> int:
    """Run the checks (all with ``deep``, else the cheap ones), print them, return the exit code."""
    from mbr_launch.report.version import version_line  # noqa: PLC0415

    results = run_checks(ctx, only_cheap=not deep, skip=set(skip))
    if as_json:
        print(to_json(results), flush=True)  # plain stdout: rich would wrap and colour the JSON
    else:
        render_table(results, console or _console(), verbose=verbose, title=version_line())
    return exit_code(results)


def preflight(ctx: DoctorContext, *, skip: Iterable[str] = frozenset(), console: Console | None = None,
              quiet: bool = False) -> bool:
    """The launcher's gate: run the cheap checks, print the problems, True to go on."""
    results = run_checks(ctx, only_cheap=True, skip=set(skip))
    render_problems(results, console, quiet=quiet)
    return exit_code(results) < 2


def _console() -> Console:
    from rich.console import Console  # noqa: PLC0415

    return Console()
