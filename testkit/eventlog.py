"""Reading an event log back (tests, benchmarks): the records of ``events.jsonl`` files as the launcher wrote them
(``mbr_launch.report.events``; ``mbr-launch report`` reads a log it does not trust through ``report.runs``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable


def read_events(path: Path | str) -> list[dict[str, Any]]:
    """The records of one events.jsonl, in file order.

    The agent may be appending while we read, so a last line without its newline that does not parse is
    left out: it is still being written. Any other line that does not parse raises ValueError naming the
    file and line, since only ``EventLog`` writes these files and a bad line there is a bug."""
    lines = Path(path).read_text().split("\n")
    tail = lines.pop()  # "" when the file ends with a newline
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{number}: not an event line ({exc})") from None
    if tail.strip():
        try:
            records.append(json.loads(tail))
        except json.JSONDecodeError:
            pass  # cut short: the writer has not finished this line yet
    return records


def read_log_dir(log_dir: Path | str) -> list[dict[str, Any]]:
    """Every record under ``--log-dir`` (one ``<run id>/events.jsonl`` per run), runs in path order."""
    return [record for path in sorted(Path(log_dir).glob("*/events.jsonl")) for record in read_events(path)]


def first_event(records: Iterable[dict[str, Any]], event: str, **match: Any) -> dict[str, Any] | None:
    """The first record of one event whose fields equal ``match`` (a missing field counts as None)."""
    return next((r for r in records if r.get("event") == event and all(r.get(k) == v for k, v in match.items())),
                None)
