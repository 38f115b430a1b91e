"""``mbr-launch doctor``: named preflight checks (ok / warn / error, what was seen, the fix). The CLI and the
launcher call ``DoctorContext.from_values``, ``run_checks``, ``run_doctor`` and ``preflight``; no typer here.

Importing the check modules fills the registry in report order. A check that raises becomes an ``error``
result naming the exception: the doctor must report, never crash.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import TYPE_CHECKING

from mbr_launch.doctor import bridge_checks, gpu, host, inprocess, ipr_launcher, launcher, nvrx_compat  # noqa: F401
from mbr_launch.doctor.context import DoctorContext
from mbr_launch.doctor.processes import detect_launcher
from mbr_launch.doctor.registry import REGISTRY, CheckResult, DoctorError, Finding, check
from mbr_launch.doctor.report import NOT_RUN, exit_code, render_problems, render_table, to_json

if TYPE_CHECKING:
    from rich.console import Console

__all__ = [
    "CheckResult", "DoctorContext", "DoctorError", "check_ids", "check_skip", "detect_launcher", "exit_code",
    "NOT_RUN", "preflight", "render_table", "run_checks", "run_doctor", "to_json",
]


@check("deep.gpu", "collective self-test: GPU GEMM and NCCL all-reduce, or gloo without a GPU", cheap=False)
def _deep(ctx: DoctorContext) -> list[CheckResult]:
    # Imported here, not at the top: ``python -m mbr_launch.doctor.deep`` must find the module unimported.
    from mbr_launch.doctor.deep import run_deep  # noqa: PLC0415

    return run_deep()


def check_ids(*, only_cheap: bool = False) -> list[str]:
    return [c.id for c in REGISTRY.values() if c.cheap or not only_cheap]


def check_skip(skip: Iterable[str]) -> None:
    """Raise ``DoctorError`` naming the ids in ``skip`` that are not checks ('all' is one)."""
    unknown = sorted(set(skip) - set(REGISTRY) - {"all"})
    if not unknown:
        return
    guesses = [g for u in unknown for g in difflib.get_close_matches(u, REGISTRY, n=1)]
    hint = f" (did you mean {', '.join(guesses)}?)" if guesses else ""
    raise DoctorError(f"unknown check id(s) {', '.join(unknown)}{hint}; valid ids: {', '.join(REGISTRY)} "
                      "(`mbr-launch doctor` shows what each one checks)")


def run_checks(ctx: DoctorContext, *, only_cheap: bool = True, skip: Iterable[str] = frozenset()) -> list[CheckResult]:
    """The cheap checks, and with ``only_cheap=False`` the deep ones too (they start processes)."""
    skip = set(skip)
    check_skip(skip)
    results: list[CheckResult] = []
    for c in REGISTRY.values():
        if only_cheap and not c.cheap:
            continue
        if c.id in skip or "all" in skip:
            results.append(CheckResult(c.id, "skip", c.title, "skipped by --skip-check", ""))
            continue
        try:
            out = c.fn(ctx)
        except Exception as exc:  # a broken probe must not hide the other checks
            results.append(CheckResult(c.id, "error", c.title, f"check crashed: {type(exc).__name__}: {exc}",
                                       "report this to the mbr-launch maintainers; --skip-check " + c.id))
            continue
        if isinstance(out, Finding):
            results.append(CheckResult(c.id, out.severity, c.title, out.saw, out.fix, named=c.named))
        elif isinstance(out, CheckResult):
            results.append(out)
        else:
            results.extend(out)
    return results


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
        render_table(results, console, verbose=verbose, title=version_line())
    return exit_code(results)


def preflight(ctx: DoctorContext, *, skip: Iterable[str] = frozenset(), console: Console | None = None,
              quiet: bool = False) -> bool:
    """The launcher's gate: run the cheap checks, print the problems, True to go on."""
    results = run_checks(ctx, only_cheap=True, skip=set(skip))
    render_problems(results, console, quiet=quiet)
    return exit_code(results) < 2
