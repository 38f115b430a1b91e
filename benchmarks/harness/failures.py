"""Why a trial failed, in one line, and the report's lines about failed trials and leftover processes."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Callable, Sequence

if TYPE_CHECKING:
    from .processes import Proc

# What a failed launch's stderr says, most specific first. "Connection reset/closed by peer" is left out: the
# surviving rank prints it after every kill, with every launcher, so it names no failure of the restart.
REASONS: list[tuple[str, str]] = [
    (r"connectFullMesh failed", "Gloo connectFullMesh failed"),
    (r"Connection refused", "connection refused"),
    (r"DistStoreError|Socket Timeout|Timed out after", "store timeout"),
    (r"RendezvousTimeoutError|RendezvousClosedError|RendezvousError", "rendezvous error"),
    (r"Address already in use|EADDRINUSE", "address in use"),
]
LEFT_BEHIND = "Processes still alive after the launcher exited (killed by the harness): "


def classify(stderr_lines: Sequence[str]) -> tuple[str, str]:
    """(label, the line that says it) for the most specific known error; else ('', last error-like line)."""
    for pattern, label in REASONS:
        for line in stderr_lines:
            if re.search(pattern, line):
                return label, line.strip()
    errorish = [ln for ln in stderr_lines if re.search(r"Error|error:|failed|FAILED|Exception|Killed|SIG[A-Z]+", ln)
                and not re.search(r"To enable traceback|elastic/errors.html", ln)]
    wordy = [ln for ln in stderr_lines if re.search(r"[A-Za-z]{3}", ln) and "elastic/errors.html" not in ln]
    return "", (errorish or wordy or [""])[-1].strip()


def failure_reason(proc: "Proc", what: str, *, since: int = 0) -> str:
    """One line: what went wrong, the recognised error, and the stderr line that shows it (stderr from byte
    ``since`` on, e.g. only what came after the kill)."""
    label, line = classify(proc.stderr_tail(400, since=since))
    return "; ".join(p for p in (what, label, f"stderr: {line[:200]}" if line else "") if p)


def first_failed(procs: "Sequence[Proc]", what: str) -> str:
    """``what``, with the stderr of the first of many agents that exited non-zero (else the first agent's)."""
    bad = next((i for i, p in enumerate(procs) if p.returncode not in (None, 0)), 0)
    codes = sorted({p.returncode for p in procs if p.returncode is not None})
    return failure_reason(procs[bad], f"{what} (agent {bad} exit code {procs[bad].returncode}; exit codes "
                                      f"seen {codes})")


def trial_label(rec: dict) -> str:
    return f"{rec['launcher']} trial {rec['trial']}"


def failure_lines(records: list[dict], *, heading: str = "Failed trials:",
                  label: Callable[[dict], str] = trial_label, limit: int | None = None,
                  leftovers: str | None = LEFT_BEHIND) -> list[str]:
    """The report's lines about failed trials (reasons cut to ``limit`` characters) and, unless
    ``leftovers`` is None, the processes a launcher left behind, after that sentence; none when clean."""
    out: list[str] = []
    failures = [r for r in records if not r["ok"]]
    if failures:
        out += [heading, ""] + [f"- {label(r)}: {r['reason'][:limit]}" for r in failures]
        out.append("")
    left = [r for r in records if r.get("leftovers")]
    if left and leftovers is not None:
        out += [leftovers + "; ".join(f"{trial_label(r)}: {r['leftovers']}" for r in left) + ".", ""]
    return out
