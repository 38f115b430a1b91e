"""Failure records and the end-of-run summary: each failure a typed record, kept for the summary and written
to the event log.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mbr_launch.decide.causes import Cause
from mbr_launch.report.exitstatus import ExitStatus
from mbr_launch.report.untrusted import REGULAR, read_file
from mbr_launch.visible import one_line, visible

MAX_ERROR_FILE = 4 << 20  # read whole: a larger one (a few KB is usual) is not read at all
MAX_TRACEBACK = 64 * 1024  # characters of the message and of the traceback kept for the summary


@dataclass(frozen=True)
class ErrorFile:
    """What a worker's ``@record``-decorated entry point wrote to TORCHELASTIC_ERROR_FILE."""

    message: str
    traceback: str
    timestamp: int

    @staticmethod
    def read(path: Path) -> "ErrorFile | None":
        """The worker's record, or None. Untrusted input: a bounded regular file, any JSON shape, text made
        visible (it goes to the terminal)."""
        try:
            raw = read_file(path, REGULAR, MAX_ERROR_FILE)
            data = json.loads(raw)  # too big: UnsafeFile, an OSError
        except (OSError, ValueError, RecursionError):
            return None
        message = data.get("message", data) if isinstance(data, dict) else data
        if isinstance(message, str):
            return ErrorFile(message=one_line(message, MAX_TRACEBACK), traceback="", timestamp=0)
        if not isinstance(message, dict):
            return None
        extra = message.get("extraInfo")
        extra = extra if isinstance(extra, dict) else {}
        stamp = extra.get("timestamp", 0)
        try:
            stamp = int(stamp) if isinstance(stamp, (int, str)) else 0
        except ValueError:
            stamp = 0
        text, callstack = message.get("message", ""), extra.get("py_callstack", "")
        return ErrorFile(message=one_line(text if isinstance(text, str) else "", MAX_TRACEBACK),
                         traceback=visible(callstack if isinstance(callstack, str) else "", MAX_TRACEBACK),
                         timestamp=stamp)


@dataclass
class FailureRecord:
    round: int
    rank: int
    local_rank: int
    node: str
    group_rank: int
    cause: Cause
    status: ExitStatus | None
    pid: int | None = None
    section: str | None = None
    detail: str = ""
    error_file: ErrorFile | None = None
    stacks: str | None = None  # path of the stack dump
    stack_summary: str | None = None

    def describe(self) -> str:
        where = f"rank {self.rank} (local rank {self.local_rank}) on {self.node}"
        what = self.detail or (self.status.describe() if self.status else self.cause.value)
        if self.section:
            what += f", in section '{self.section}'"
        return f"{where}: {what}"

    def to_event(self) -> dict[str, Any]:
        return {"round": self.round, "rank": self.rank, "local_rank": self.local_rank, "cause": self.cause.value,
                "exit_code": self.status.code if self.status else None,
                "signal": self.status.signal if self.status else None, "section": self.section,
                "killed_by": self.status.killed_by if self.status else None,
                "kill_detail": self.status.cause.text if self.status and self.status.cause else None,
                "detail": self.detail, "pid": self.pid, "stacks": self.stacks}


@dataclass
class RunSummary:
    failures: list[FailureRecord] = field(default_factory=list)
    restarts: int = 0
    exit_code: int = 0
    reason: str = ""
    goodput: str = ""  # goodput_text.render() of this node: where its time went
    losses: list[str] = field(default_factory=list)  # what the log files miss (a full disk, an I/O error)

    def root_cause(self) -> FailureRecord | None:
        """The failure whose error file has the earliest timestamp, else the first recorded."""
        with_files = [f for f in self.failures if f.error_file and f.error_file.timestamp]
        if with_files:
            return min(with_files, key=lambda f: f.error_file.timestamp)  # type: ignore[union-attr]
        return self.failures[0] if self.failures else None

    def render(self) -> str:
        if not self.failures:
            return "\n".join([*([self.goodput] if self.goodput else []), *self.losses])
        lines = ["=" * 72, f"mbr-launch failure summary ({len(self.failures)} failure(s), {self.restarts} restart(s))"]
        for record in self.failures:
            lines.append(f"  round {record.round}: {record.describe()}")
            if record.stacks:
                lines.append(f"      stacks: {record.stacks}" +
                             (f"  [{record.stack_summary}]" if record.stack_summary else ""))
        root = self.root_cause()
        if root and root.error_file and root.error_file.traceback:
            lines.append(f"Root cause (first error, rank {root.rank}): {root.error_file.message}")
            lines.extend("  " + line for line in root.error_file.traceback.rstrip().splitlines())
        if self.goodput:
            lines.append(self.goodput)
        lines.extend(self.losses)
        lines.append(f"Result: {self.reason} (exit code {self.exit_code})")
        lines.append("=" * 72)
        return "\n".join(lines)


def loss_lines(records: list[dict[str, Any]], events_lost: int, events_error: str) -> list[str]:
    """The summary's lines about log files that could not be written, the event log's own included."""
    lines = []
    for r in records:
        if r.get("event") == "output_lost":
            who = f"rank {r['rank']} {r['stream']}" if r.get("rank") is not None else str(r.get("stream"))
            lines.append(f"WARNING: {who}: {r['lost_lines']} line(s) ({r['lost_bytes']} bytes) missing from "
                         f"{r['path']} ({r['error']}); they went to the console only")
    if events_lost:
        lines.append(f"WARNING: {events_lost} event(s) missing from events.jsonl ({events_error})")
    return lines
