"""What a check found: one type for the doctor's preflight checks (a table row) and a node's own checks
before it joins (passed or failed; ``name`` and ``detail`` are the ``health_check`` event's words)."""

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
        return cls(id, "skip" if skipped else "ok", "", saw)

    @classmethod
    def failed(cls, id: str, saw: str) -> CheckResult:
        return cls(id, "error", "", saw)
