"""The JSON-lines event log: one object per line, written as things happen and never rewritten. Common fields:
``v``, ``ts`` (ISO-8601 UTC), ``t`` (seconds since launch), ``event``, ``node``, ``group_rank``; each event's
own in ``EVENT_FIELDS`` (their meanings: docs/events.md).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from mbr_launch.report.appender import LineAppender, Writer, describe
from mbr_launch.report.private import make_dir
from mbr_launch.visible import one_line

SCHEMA_VERSION = 1

# event name -> fields it always carries (besides the common ones)
EVENT_FIELDS: dict[str, tuple[str, ...]] = {
    "start": ("argv", "run_id", "nproc_per_node", "nnodes", "max_restarts", "log_dir", "version"),
    "rendezvous": ("round", "group_world_size", "world_size", "rank_offset", "master_addr",
                   "master_port", "restart_count", "seconds", "fast"),
    "worker_start": ("rank", "local_rank", "pid", "round"),
    "worker_exit": ("rank", "local_rank", "pid", "round", "exit_code", "signal", "seconds", "killed_by",
                    "kill_detail"),
    "hang": ("rank", "local_rank", "pid", "round", "kind", "section", "timeout", "elapsed",
             "last_heartbeat_age", "open_sections"),
    "stacks": ("round", "method", "paths"),
    "verdict": ("round", "inquiry", "culprits", "nodes", "group_ranks", "basis", "reason", "waiting", "decider",
                "seconds", "evidence"),
    "failure": ("round", "rank", "local_rank", "cause", "exit_code", "signal", "section", "detail", "killed_by",
                "kill_detail"),
    "rank_lost": ("round", "ranks", "local_ranks", "healthy_nodes", "nodes", "min_nodes", "alive"),
    "stop": ("round", "reason", "origin"),
    "restart": ("round", "restart_count", "max_restarts", "scope", "backoff"),
    "exclude": ("round", "reason"),
    "leave_failed": ("round", "reason"),
    "peer_lost": ("round", "kind", "detail"),
    "workload_request": ("rank", "action", "description"),
    "monitor_lost": ("round", "exit_code"),
    "monitor_warning": ("round", "local_rank", "pid", "message"),
    "signal": ("signal",),
    "preemption": ("signal", "forward", "grace"),
    "signal_reach": ("round", "reach", "by", "signalled", "nodes"),
    "node_left": ("round", "signal", "next", "reason"),
    "peer_left": ("round", "group_ranks"),
    "requeue": ("job", "ok"),
    "first_step": ("round", "rank", "local_rank", "seconds"),
    "first_progress": ("round", "rank", "local_rank", "kind", "seconds"),
    "progress": ("round", "started", "first_step", "last_step", "checkpoint", "ended", "cause", "steps"),
    "straggler": ("round", "interval", "threshold", "stragglers", "ranks"),
    "cycle_progress": ("round", "cycle", "source", "start", "end", "progress", "no_progress_cycles",
                       "max_no_progress_cycles", "stop"),
    "goodput": ("wall", "goodput", "seconds", "failures"),
    "output_lost": ("rank", "local_rank", "stream", "path", "error", "lost_bytes", "lost_lines"),
    "health_check": ("round", "ok", "failed", "detail", "seconds", "checks"),
    "leftovers": ("round", "count", "processes"),
    "gpu_memory": ("round", "reclaimed", "seconds", "polls", "used_mb", "tolerance_mb", "timeout", "skipped",
                   "held_by", "short"),
    "end": ("exit_code", "reason", "seconds"),
}


class EventLog:
    """Appends events to ``path`` and keeps them in memory for the summary. Writing never fails the run: on
    an I/O error the file keeps its complete lines, ``warn`` is called once and unwritten events are counted."""

    def __init__(self, path: Path | None, *, node: str, clock=time.monotonic,
                 warn: Callable[[str], None] | None = None,
                 write: Writer = os.write) -> None:
        self._clock = clock
        self._t0 = clock()
        self._node = node
        self._lock = threading.Lock()
        self._warn = warn or _warn_stderr
        self.group_rank: int | None = None
        self.records: list[dict[str, Any]] = []
        self._out: LineAppender | None = None
        if path is not None:
            try:
                make_dir(path.parent)
            except OSError:
                pass  # the appender's open fails the same way, and reports it
            self._out = LineAppender(path, fresh=True, write=write)  # a new run's log: never one found there
        self.path = path
        self._warned = False
        self._closed = False

    @property
    def lost(self) -> int:
        return self._out.lost_lines if self._out else 0

    @property
    def write_error(self) -> OSError | None:
        return self._out.error if self._out else None

    def emit(self, event: str, **fields: Any) -> dict[str, Any]:
        if event not in EVENT_FIELDS:
            raise ValueError(f"unknown event {event!r}")
        record = {"v": SCHEMA_VERSION, "ts": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
                  "t": round(self._clock() - self._t0, 4), "event": event, "node": self._node,
                  "group_rank": self.group_rank}
        for name in EVENT_FIELDS[event]:
            record[name] = fields.pop(name, None)
        record.update(fields)
        line = (json.dumps(record, default=str) + "\n").encode()
        with self._lock:
            self.records.append(record)
            if self._out and not self._closed and not self._out.append(line) and not self._warned:
                self._warned = True
                try:
                    self._warn(f"WARNING: cannot write the event log {self.path}: {describe(self._out.error)}; "
                               "the run goes on; the events it misses are counted in the summary")
                except (OSError, ValueError):
                    pass  # the console may be gone too: the count stays
        return record

    def t_of(self, monotonic: float) -> float:
        """A ``time.monotonic()`` value as this log's ``t`` (seconds since launch)."""
        return round(monotonic - self._t0, 4)

    def close(self) -> None:
        """Close the file; later events are kept in memory only (they are not counted as lost)."""
        self._closed = True
        if self._out:
            self._out.close()


def _warn_stderr(message: str) -> None:
    try:
        print(f"[mbr-launch] {message}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def event_time(record: dict[str, Any]) -> float:
    """A record's ``ts`` as seconds since the epoch (comparable with ``time.time()``)."""
    return datetime.fromisoformat(record["ts"]).timestamp()


# ---- a record of a log that anyone may have written (``mbr-launch report``) --------------------------------
#
# A run folder may be a neighbour's (a shared --log-dir): each record is checked once, here, so past this edge
# the report meets no NaN, no nested dict where a name belongs, no escape sequence.

MAX_TEXT = 2000  # characters of one text field the report prints
MAX_SECONDS = 1e9  # seconds since launch (30 years); beyond 2**53 JSON tools lose integers
MAX_INT = 1 << 53

TIME, INT, TEXT, TEXTS, NNODES = "time", "int", "text", "texts", "nnodes"
REQUIRED = {"ts", "t", "event"}  # every record; progress records also need started and ended
# The fields ``mbr-launch report`` reads, by event, and what each must be. A record keeps only these, which
# bounds what it can cost. Null means absent.
COMMON_FIELDS = {"ts": TEXT, "t": TIME, "event": TEXT, "node": TEXT, "group_rank": INT}
REPORT_FIELDS: dict[str, dict[str, str]] = {
    "start": {"run_id": TEXT, "nnodes": NNODES, "argv": TEXTS},
    "rendezvous": {"round": INT, "world_size": INT, "group_world_size": INT, "restart_count": INT},
    "worker_start": {"round": INT},
    "worker_exit": {"round": INT},
    "failure": {"round": INT, "rank": INT, "local_rank": INT, "cause": TEXT, "exit_code": INT, "signal": TEXT,
                "section": TEXT, "detail": TEXT},
    "restart": {"round": INT, "restart_count": INT, "max_restarts": INT, "scope": TEXT, "backoff": TIME},
    "progress": {"round": INT, "started": TIME, "ended": TIME, "first_step": TIME, "last_step": TIME,
                 "checkpoint": TIME, "detected": TIME, "cause": TEXT, "cause_detail": TEXT, "steps": INT,
                 "first_iteration": INT, "last_iteration": INT},
    "end": {"exit_code": INT, "reason": TEXT},
}
_REQUIRED_BY_EVENT: dict[str, set[str]] = {"progress": {"started", "ended"}}


class BadRecord(ValueError):
    """One line of a log is not an event the report can use; the message says why."""


def _no_constant(name: str) -> Any:
    raise BadRecord(f"{name} is not a number")  # json.loads takes NaN and Infinity unless told not to


def report_record(line: bytes) -> dict[str, Any]:
    """One event line as the report reads it: the fields of ``REPORT_FIELDS``, checked. Raises ``BadRecord``."""
    try:
        record = json.loads(line.decode("utf-8"), parse_constant=_no_constant)
    except UnicodeDecodeError:
        raise BadRecord("not UTF-8 text") from None
    except RecursionError:
        raise BadRecord("nested too deeply") from None
    except BadRecord:
        raise
    except ValueError as exc:  # not JSON, or an integer of more digits than Python converts
        raise BadRecord(f"not JSON ({str(exc).split(':')[0]})") from None
    if not isinstance(record, dict):
        raise BadRecord("not a JSON object")
    event = record.get("event")
    known = isinstance(event, str)  # else the check of "event" below refuses it
    wanted = {**COMMON_FIELDS, **REPORT_FIELDS.get(event, {})} if known else COMMON_FIELDS
    required = REQUIRED | _REQUIRED_BY_EVENT.get(event, set()) if known else REQUIRED
    out: dict[str, Any] = {}
    for name, kind in wanted.items():
        value = record.get(name)
        if value is None:
            if name in required:
                raise BadRecord(f"no {name!r}")
            continue
        out[name] = _checked(name, kind, value)
    return out


def _checked(name: str, kind: str, value: Any) -> Any:
    if kind == TEXT and isinstance(value, str):
        return one_line(value, MAX_TEXT)
    if kind == INT and type(value) is int and -MAX_INT <= value <= MAX_INT:  # not bool: true is no rank
        return value
    if kind == TIME and type(value) in (int, float) and 0 <= value <= MAX_SECONDS:  # inf fails; NaN never came
        return float(value)
    if kind == TEXTS and isinstance(value, list) and all(isinstance(v, str) for v in value):
        return [one_line(v, MAX_TEXT) for v in value]
    if kind == NNODES and isinstance(value, str):
        return one_line(value, MAX_TEXT)
    if kind == NNODES and type(value) is int and -MAX_INT <= value <= MAX_INT:
        return value
    what = {TEXT: "a string", INT: f"an integer (at most {MAX_INT})", TIME: f"seconds (0 to {MAX_SECONDS:g})",
            TEXTS: "a list of strings", NNODES: "a string"}[kind]
    raise BadRecord(f"{name!r} is not {what}")
