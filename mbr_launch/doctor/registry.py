"""The check table: what a check returns, ``@check`` registration (its order is the report order), and the
error for a bad check id.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from mbr_launch.health.result import CheckResult, Severity

if TYPE_CHECKING:
    from mbr_launch.doctor.context import DoctorContext


class DoctorError(Exception):
    """A misuse of the doctor itself (e.g. ``--skip-check`` with an id that does not exist)."""


@dataclass(frozen=True)
class Finding:
    """What a check function returns: the registry adds id and title to make a ``CheckResult``."""

    severity: Severity
    saw: str
    fix: str = ""


CheckFn = Callable[["DoctorContext"], "Finding | CheckResult | Iterable[CheckResult]"]


@dataclass(frozen=True)
class Check:
    id: str
    title: str
    cheap: bool
    fn: CheckFn
    named: bool = False  # its warnings are printed in full at launch (something a person must see there)


REGISTRY: dict[str, Check] = {}
T = TypeVar("T")
GatedFn = Callable[[T, "DoctorContext"], Finding]


def check(id: str, title: str, *, cheap: bool = True, named: bool = False) -> Callable[[CheckFn], CheckFn]:
    def register(fn: CheckFn) -> CheckFn:
        if id in REGISTRY:
            raise RuntimeError(f"check id {id!r} registered twice")
        REGISTRY[id] = Check(id=id, title=title, cheap=cheap, fn=fn, named=named)
        return fn

    return register


def check_with(gate: Callable[["DoctorContext"], "T | Finding"], id: str, title: str, *,
               cheap: bool = True) -> Callable[[GatedFn[T]], GatedFn[T]]:
    """A check of what ``gate`` gives (the loaded config, the GPUs, ...), else the gate's finding (a skip)."""

    def register(fn: GatedFn[T]) -> GatedFn[T]:
        def run(ctx: DoctorContext) -> Finding:
            got = gate(ctx)
            return got if isinstance(got, Finding) else fn(got, ctx)

        check(id, title, cheap=cheap)(run)
        return fn

    return register


# Short constructors keep each check readable as a decision table.
def ok(saw: str) -> Finding:
    return Finding("ok", saw)


def warn(saw: str, fix: str) -> Finding:
    return Finding("warn", saw, fix)


def error(saw: str, fix: str) -> Finding:
    return Finding("error", saw, fix)


def skip(saw: str) -> Finding:
    return Finding("skip", saw)


def info(saw: str, fix: str = "") -> Finding:
    return Finding("info", saw, fix)
