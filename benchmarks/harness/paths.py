"""Where things are: the repository, the bench workers, the launchers' bin directory.

The benches run as ``python benchmarks/bench_x.py``, which puts only ``benchmarks/`` on sys.path; the
repository goes first too, so that the harness imports this checkout's ``mbr_launch`` (its event reader) and
``testkit.helpers`` (the one ``free_port``). Only this process: the launchers get their own PYTHONPATH."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WORKERS = REPO / "benchmarks" / "workers"
COLLECTIVE = WORKERS / "collective.py"
BIN = Path(sys.executable).parent

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
