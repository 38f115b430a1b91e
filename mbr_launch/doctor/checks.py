"""Run the registered checks (importing the check modules fills the registry in report order). A check that
raises becomes an ``error`` result naming the exception: the doctor must report, never crash.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from mbr_launch.doctor import bridge_checks, gpu, host, inprocess, ipr_launcher, launcher, nvrx_compat  # noqa: F401
from mbr_launch.doctor.context import DoctorContext
from mbr_launch.doctor.registry import REGISTRY, CheckResult, DoctorError, Finding, check


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
