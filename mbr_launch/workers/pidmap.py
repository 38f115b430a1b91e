"""The run folder's ``ranks.json``: which process is which rank now, for tools that look at processes.

A worker born from a warm standby was started before its rank was known, so ``/proc/<pid>/environ`` (fixed at
exec) has no ``RANK``, ``LOCAL_RANK`` or ``WORLD_SIZE``; its process title and ``os.environ`` inside do. Tools
that map pids to ranks from outside (a profiler, a GPU-memory report) read this file instead: rewritten, whole
and at once (a new name, then a rename), each time workers start.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable, Protocol

from mbr_launch.report.private import write_private

NAME = "ranks.json"


class _Worker(Protocol):
    rank: int
    local_rank: int
    pid: int


def write(run_dir: Path, *, round_index: int, restart_count: int, world_size: int,
          workers: Iterable[_Worker]) -> None:
    """Replace ``<run_dir>/ranks.json``; a full disk leaves the old one (the events have every start too)."""
    record = {"round": round_index, "restart_count": restart_count, "world_size": world_size,
              "ranks": [{"rank": w.rank, "local_rank": w.local_rank, "pid": w.pid}
                        for w in sorted(workers, key=lambda w: w.local_rank)]}
    path, tmp = run_dir / NAME, run_dir / f".{NAME}.tmp"
    try:
        write_private(tmp, (json.dumps(record) + "\n").encode())
        os.replace(tmp, path)
    except OSError:
        pass
