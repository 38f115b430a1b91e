"""When things happened: the workers' ready lines and mbr-launch's events.jsonl.

Both carry wall-clock times (``time.time()`` in the ready lines, ISO ``ts`` in the events), so a bench
compares them with its own ``time.time()`` stamps (kill, launch)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from mbr_launch.report import events as event_log
from testkit import eventlog


@dataclass(frozen=True)
class Ready:
    """One ``ready <rank> <restart> <time.time()> <pid>`` line of a worker."""
    rank: int
    restart: int
    time: float
    pid: int


def read_ready(path: Path) -> list[Ready]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 5 and parts[0] == "ready":
            out.append(Ready(int(parts[1]), int(parts[2]), float(parts[3]), int(parts[4])))
    return out


def ready_ranks(path: Path, restart: int) -> dict[int, Ready]:
    return {r.rank: r for r in read_ready(path) if r.restart == restart}


class Polled(Protocol):
    def poll(self) -> int | None: ...


def wait_ready(proc: Polled, path: Path, *, restart: int, nproc: int, timeout: float,
               poll: float = 0.01) -> tuple[str, dict[int, Ready]]:
    """('ready'|'exited'|'timeout', ranks seen) -- exited: the launcher ended before every rank was ready."""
    end = time.monotonic() + timeout
    while True:
        seen = ready_ranks(path, restart)
        if len(seen) >= nproc:
            return "ready", seen
        if proc.poll() is not None:
            return "exited", ready_ranks(path, restart)
        if time.monotonic() >= end:
            return "timeout", seen
        time.sleep(poll)


def parse_ts(ts: str) -> float:
    """An event's ``ts`` as seconds since the epoch."""
    return event_log.event_time({"ts": ts})


def read_events(log_dir: Path) -> list[dict[str, Any]]:
    """The records of mbr-launch's events.jsonl under log_dir (one run per log_dir), read by the launcher's
    own reader (tolerant of a last line still being written)."""
    return eventlog.read_log_dir(log_dir)
