"""What a check found: one type for the doctor's preflight checks and for the checks a node runs before it joins a round.

The doctor reads a result as a table row (``id``, ``severity``, ``title``, what it ``saw``, the ``fix``); a
node's own checks read the same result as passed or failed: ``ok`` (nothing failed), ``skipped`` (nothing
to check here, never a failure), ``name`` and ``detail`` (the id and what was seen, the words of the node's
``health_check`` event). A node check has no title: it is reported by its id.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Severity = Literal["ok", "warn", "error", "skip", "info"]
SEVERITIES: tuple[Severity, ...] = ("ok", "warn", "error", "skip", "info")


@dataclass(frozen=True)
class CheckResult:
    id: str
    severity: Severity
    title: str
    saw: str
    fix: str = ""
    named: bool = False  # a warning the launcher's preflight prints in full rather than only counting it

    @property
    def ok(self) -> bool:
        return self.severity != "error"

    @property
    def skipped(self) -> bool:
        return self.severity == "skip"

    @property
    def name(self) -> str:
        return self.id

    @property
    def detail(self) -> str:
        return self.saw

    @classmethod
    def passed(cls, id: str, saw: str, *, skipped: bool = False) -> CheckResult:
        """A node check that found nothing wrong (``skipped``: found nothing to check)."""
        return cls(id, "skip" if skipped else "ok", "", saw)

    @classmethod
    def failed(cls, id: str, saw: str) -> CheckResult:
        """A node check that failed: ``saw`` says why."""
        return cls(id, "error", "", saw)
