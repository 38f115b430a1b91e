"""Finding one run's event logs for ``mbr-launch report``: the folder a person names, or the latest run.

A node's run folder holds its ``events.jsonl``. Nodes that share a ``--log-dir`` write their folders side by
side, so the other nodes of a run are the sibling folders whose ``start`` event has the same run id and whose
time overlaps this node's. The latest run under a base folder is its ``latest`` link when there is one (it may
name a node's folder or a folder of node folders), else the run folder whose log changed last.
Every problem is a ``ReportError``: one line that says what to pass instead.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mbr_launch.report.events import event_time, read_events

LOG = "events.jsonl"
LATEST = "latest"


class ReportError(Exception):
    """The run cannot be reported: the message says why and what to do."""


@dataclass(frozen=True)
class NodeLog:
    path: Path  # the events.jsonl
    records: list[dict[str, Any]]


def find_run(target: Path | None, base: Path) -> list[NodeLog]:
    """The node logs of the run at ``target`` (a run folder, its events.jsonl, or a folder of runs: its
    latest), or of the latest run under ``base`` when no target is given."""
    if target is None:
        if not base.is_dir():
            raise ReportError(f"no runs under {base} yet: pass the run folder a launch printed "
                              "('logs and events in ...')")
        return _with_siblings(_latest(base))
    if not target.exists():
        raise ReportError(f"no such run folder: {target}")
    if target.is_file():
        return _with_siblings(_load(target))
    if (target / LOG).exists():
        return _with_siblings(_load(target / LOG))
    return _with_siblings(_latest(target))


def _latest(base: Path) -> NodeLog:
    link = base / LATEST
    if link.exists():
        if (link / LOG).is_file():
            return _load(link / LOG)
        inside = sorted(link.glob(f"*/{LOG}"))
        if inside:
            return _load(inside[0])
    logs = [p for p in base.glob(f"*/{LOG}") if p.is_file()] or [p for p in base.glob(f"*/*/{LOG}") if p.is_file()]
    if not logs:
        raise ReportError(f"{base} holds no run folder (no */{LOG}): pass the run folder a launch printed "
                          "('logs and events in ...')")
    return _load(max(logs, key=_mtime))


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _load(path: Path) -> NodeLog:
    try:
        records = read_events(path)
    except OSError as exc:
        raise ReportError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ReportError(f"{path} is not an mbr-launch event log: it is not text") from None
    except ValueError as exc:  # its message names the file and line
        raise ReportError(f"not an mbr-launch event log: {exc}") from None
    if not records:
        raise ReportError(f"{path} is empty: the launch wrote no event (did it start?)")
    if not all(isinstance(r, dict) and isinstance(r.get("event"), str) and isinstance(r.get("t"), (int, float))
               and isinstance(r.get("ts"), str) for r in records):
        raise ReportError(f"{path} is not an mbr-launch event log: a line without event, t or ts")
    if records[0].get("event") != "start":
        raise ReportError(f"{path} does not begin with a start event: not a whole mbr-launch event log")
    try:
        event_time(records[0])
    except ValueError:
        raise ReportError(f"{path}: the start event's time {records[0].get('ts')!r} is not a date") from None
    return NodeLog(path, records)


def _span(records: list[dict[str, Any]]) -> tuple[float, float]:
    """A log's first and last moments, in seconds since the epoch."""
    start = event_time(records[0])
    return start, start + max(float(r.get("t", 0.0)) for r in records)


def _with_siblings(node: NodeLog) -> list[NodeLog]:
    """This node's log and those of its run's other nodes in the same folder (a shared --log-dir)."""
    start = node.records[0]
    if _max_nodes(start.get("nnodes")) <= 1:
        return [node]
    run_id, (began, ended) = start.get("run_id"), _span(node.records)
    found = [node]
    for path in sorted(node.path.parent.parent.glob(f"*/{LOG}")):
        if path == node.path or _first(path).get("run_id") != run_id:
            continue
        try:
            other = _load(path)
        except ReportError:
            continue  # a broken neighbour is its own run's problem
        o_began, o_ended = _span(other.records)
        if o_began <= ended and began <= o_ended:
            found.append(other)
    return found


def _first(path: Path) -> dict[str, Any]:
    try:
        with path.open() as f:
            record = json.loads(f.readline())
    except (OSError, ValueError, UnicodeDecodeError):
        return {}
    return record if isinstance(record, dict) else {}


def _max_nodes(nnodes: Any) -> int:
    try:
        return int(str(nnodes).rpartition(":")[2])
    except ValueError:
        return 1
