"""Finding one run's event logs for ``mbr-launch report``: the folder a person names, or the latest run.

The other nodes of a run are the sibling folders (a shared ``--log-dir``) whose ``start`` has the same run id,
whose owner is the named log's and whose time overlaps. Others' files may be planted there: logs are read as
``untrusted.open_file`` allows, within the bounds below, one checked record at a time, and a ``latest`` link is
followed only when it is ours. Every problem is a ``ReportError``: one line."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from mbr_launch.report.events import BadRecord, event_time, report_record
from mbr_launch.report.untrusted import open_file
from mbr_launch.visible import one_line

LOG = "events.jsonl"
LATEST = "latest"
# Bounds on what one report reads, and so on its memory (a parsed record costs several times its line): a
# busy node's log of a thousand restarts stays under 30 MB; a line of a verdict over 100,000 ranks under 1 MiB.
MAX_LOG_BYTES = 64 << 20
MAX_RECORDS = 200_000  # a file of tiny lines would cost ten times its size in parsed objects
MAX_LINE_BYTES = 4 << 20  # a longer line is skipped without ever being held whole
READ_CHUNK = 1 << 16
MAX_RUN_BYTES = 4 * MAX_LOG_BYTES
MAX_RUN_RECORDS = 4 * MAX_RECORDS
MiB = 1 << 20


class ReportError(Exception):
    """The run cannot be reported: the message says why and what to do."""


@dataclass(frozen=True)
class NodeLog:
    path: Path  # the events.jsonl
    records: list[dict[str, Any]]  # as events.report_record gives them: checked, only the fields the report reads
    notes: tuple[str, ...] = ()  # what of the file the report left out, and why: one line each
    owner: int | None = None  # the file's uid
    size: int = 0  # bytes read


class BoundedLines:
    """The lines of an open file, at most ``max_bytes`` of it; a line longer than ``max_line`` is skipped
    (``too_long``) as it streams by. Yields (line number, bytes, whether a newline ended it)."""

    def __init__(self, fd: int, *, max_bytes: int = MAX_LOG_BYTES, max_line: int = MAX_LINE_BYTES) -> None:
        self._fd, self._max_bytes, self._max_line = fd, max_bytes, max_line
        self.too_long = 0
        self.unread = 0  # bytes past max_bytes, not read

    def __iter__(self) -> Iterator[tuple[int, bytes, bool]]:
        line, number, skipping, read = bytearray(), 0, False, 0
        while read < self._max_bytes:
            chunk = os.read(self._fd, min(READ_CHUNK, self._max_bytes - read))
            if not chunk:
                break
            read += len(chunk)
            start = 0
            while (end := chunk.find(b"\n", start)) >= 0:
                number += 1
                if skipping or len(line) + end - start > self._max_line:
                    self.too_long += 1
                else:
                    yield number, bytes(line + chunk[start:end]), True
                line.clear()
                skipping, start = False, end + 1
            if not skipping:
                line += chunk[start:]
                if len(line) > self._max_line:
                    skipping = True
                    line.clear()
        if read >= self._max_bytes:  # what is left of the file is not read (nor the line the bound cut)
            self.unread = max(0, os.fstat(self._fd).st_size - read)
        if skipping:
            self.too_long += 1
        elif line and not self.unread:
            yield number + 1, bytes(line), False


def find_run(target: Path | None, base: Path) -> list[NodeLog]:
    """The node logs of the run at ``target`` (a run, its log, a folder of runs), else the latest in ``base``."""
    try:
        if target is None:
            if not base.is_dir():
                raise ReportError(f"no runs under {base} yet: pass the run folder a launch printed "
                                  "('logs and events in ...')")
            return _with_siblings(_latest(base))
        if not os.path.lexists(target):
            raise ReportError(f"no such run folder: {target}")
        if not target.is_dir():  # its events.jsonl (or something else, which the reader refuses)
            return _with_siblings(_load(target))
        if os.path.lexists(target / LOG):
            return _with_siblings(_load(target / LOG))
        return _with_siblings(_latest(target))
    except OSError as exc:  # a name too long, a folder we may not list: the path and the reason, no traceback
        raise ReportError(f"cannot read {exc.filename or target or base}: {exc.strerror or exc}") from None


def _latest(base: Path) -> NodeLog:
    link = base / LATEST
    if _ours(link) and link.is_dir():  # the launcher makes it; another user's "latest" is not followed
        if _plain_file(link / LOG):
            return _load(link / LOG)
        inside = sorted(p for p in link.glob(f"*/{LOG}") if _regular(p, link))
        if inside:
            return _load(inside[0])
    logs = [p for p in base.glob(f"*/{LOG}") if _regular(p, base)] or \
        [p for p in base.glob(f"*/*/{LOG}") if _regular(p, base)]
    if not logs:
        raise ReportError(f"{base} holds no run folder (no */{LOG}): pass the run folder a launch printed "
                          "('logs and events in ...')")
    # the newest of our own runs; another user's log, however new it says it is, only when there is none
    mine = [p for p in logs if _ours(p)]
    return _load(max(mine or logs, key=_mtime))


def _ours(path: Path) -> bool:
    try:
        return os.lstat(path).st_uid == os.geteuid()
    except OSError:
        return False


def _plain_file(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _regular(path: Path, base: Path) -> bool:
    """A regular file in folders under ``base`` that are no symlinks (a glob follows links, to anywhere)."""
    try:
        folders = list(path.relative_to(base).parents)[:-1]  # "a/b", "a": not "." (base itself)
        return _plain_file(path) and not any(stat.S_ISLNK(os.lstat(base / f).st_mode) for f in folders)
    except (OSError, ValueError):
        return False


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _load(path: Path, *, max_records: int = MAX_RECORDS) -> NodeLog:
    try:
        fd = open_file(path)
    except OSError as exc:
        raise ReportError(f"cannot read {path}: {exc.strerror or exc}") from None
    records: list[dict[str, Any]] = []
    skipped, first_skip, more = 0, "", False
    try:
        owner = os.fstat(fd).st_uid
        lines = BoundedLines(fd)
        for number, line, whole in lines:
            if len(records) >= max_records:
                more = True
                break
            if not line.strip():
                continue
            if not records and lines.too_long:  # without its start event nothing in the file can be placed
                raise ReportError(f"{path} is not an mbr-launch event log: its first line is longer than "
                                  f"{MAX_LINE_BYTES // MiB} MiB")
            try:
                records.append(report_record(line))
            except BadRecord as exc:
                if not whole:
                    continue  # the last line, without its newline: its writer has not finished it yet
                if not records:  # the start event, as above
                    raise ReportError(f"{path} is not an mbr-launch event log: line {number}: {exc}") from None
                skipped += 1
                first_skip = first_skip or f"line {number}: {exc}"
        size = os.lseek(fd, 0, os.SEEK_CUR)
    except OSError as exc:
        raise ReportError(f"cannot read {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if not records and not lines.too_long:
        raise ReportError(f"{path} is empty: the launch wrote no event (did it start?)")
    if not records or records[0]["event"] != "start":
        raise ReportError(f"{path} does not begin with a start event: not a whole mbr-launch event log")
    try:
        event_time(records[0])
    except (ValueError, OverflowError, OSError):
        raise ReportError(f"{path}: the start event's time {records[0]['ts']!r} is not a date") from None
    notes = []
    if skipped:
        notes.append(f"{skipped} record(s) skipped, not what mbr-launch writes (the first: {first_skip})")
    if lines.too_long:
        notes.append(f"{lines.too_long} line(s) longer than {MAX_LINE_BYTES // MiB} MiB skipped unread")
    if lines.unread:
        notes.append(f"only the first {MAX_LOG_BYTES // MiB} MiB read: {lines.unread} more byte(s) left out")
    elif more:
        notes.append(f"only the first {max_records} records read: the rest left out")
    return NodeLog(path, records, notes=tuple(notes), owner=owner, size=size)


def _span(records: list[dict[str, Any]]) -> tuple[float, float]:
    start = event_time(records[0])
    return start, start + max(float(r["t"]) for r in records)


def _with_siblings(node: NodeLog) -> list[NodeLog]:
    start = node.records[0]
    if _max_nodes(start.get("nnodes")) <= 1 or start.get("run_id") is None:
        return [node]
    run_id, (began, ended) = start.get("run_id"), _span(node.records)
    found = [node]
    size, count, left_out = node.size, len(node.records), 0
    shared = node.path.parent.parent
    for path in sorted(shared.glob(f"*/{LOG}")):
        if path == node.path or not _regular(path, shared) or _first(path, node.owner).get("run_id") != run_id:
            continue
        if size >= MAX_RUN_BYTES or count >= MAX_RUN_RECORDS:
            left_out += 1
            continue
        try:
            other = _load(path, max_records=min(MAX_RECORDS, MAX_RUN_RECORDS - count))
        except ReportError:
            continue  # a broken neighbour is its own run's problem
        if other.owner != node.owner:
            continue  # swapped since _first looked
        o_began, o_ended = _span(other.records)
        if o_began <= ended and began <= o_ended:
            found.append(other)
            size, count = size + other.size, count + len(other.records)
    if left_out:
        note = (f"{left_out} more node log(s) of run {one_line(str(run_id))} not read: the report reads at "
                f"most {MAX_RUN_BYTES // MiB} MiB or {MAX_RUN_RECORDS} records of a run")
        found[0] = NodeLog(node.path, node.records, (*node.notes, note), node.owner, node.size)
    return found


def _first(path: Path, owner: int | None) -> dict[str, Any]:
    """The first record of the log at ``path`` if it is a file of ``owner`` (else, or unreadable: {})."""
    try:
        fd = open_file(path)
    except OSError:
        return {}
    try:
        if os.fstat(fd).st_uid != owner:
            return {}  # another user's folder is no node of our run, whatever run id it claims
        for number, line, _ in BoundedLines(fd, max_bytes=MAX_LINE_BYTES + 1):
            return report_record(line) if number == 1 else {}
    except (OSError, BadRecord):
        pass
    finally:
        os.close(fd)
    return {}


def _max_nodes(nnodes: Any) -> int:
    try:
        return int(str(nnodes).rpartition(":")[2])
    except ValueError:
        return 1
