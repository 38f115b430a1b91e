"""The machine and software a report was measured on, and quiet helpers for outside commands."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from .paths import REPO


def run_quiet(argv: list[str], timeout: float = 30) -> str:
    """stdout of a short command run in the repository; "" when it is missing or too slow (a report line
    degrades to '?' rather than failing a bench that has already run for minutes)."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=REPO).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def meminfo_gib() -> str:
    try:
        kb = int(next(l.split()[1] for l in Path("/proc/meminfo").read_text().splitlines()
                      if l.startswith("MemTotal")))
        return f"{kb / 2**20:.1f} GiB"
    except (OSError, StopIteration, ValueError):
        return "?"


def machine_lines(*, gpu: bool, mbr_code: str) -> list[str]:
    """The Markdown bullet lines every report starts with: date, machine, versions, backend."""
    lines = [
        f"- date: {run_quiet(['date', '-u']) or datetime.now(timezone.utc).isoformat()}",
        f"- machine: `{run_quiet(['uname', '-a']) or platform.platform()}`; {os.cpu_count()} CPUs (nproc "
        f"{run_quiet(['nproc'])}), {meminfo_gib()} memory; load average at start {os.getloadavg()[0]:.2f}",
        f"- python {platform.python_version()}, torch {version('torch')}, nvidia-resiliency-ext "
        f"{version('nvidia-resiliency-ext')}, mbr-launch {version('mbr-launch')}: {mbr_code}",
    ]
    if gpu:
        gpus = run_quiet(["nvidia-smi", "-L"]).splitlines()
        lines.append(f"- backend: nccl; GPUs: {'; '.join(gpus) or 'none found'}")
    else:
        lines.append("- backend: gloo on CPU")
    return lines


def _busy_seconds() -> float:
    """CPU time the whole machine has spent busy since boot (every core; /proc/stat's first line)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _used_bytes() -> int:
    info = {l.split(":")[0]: int(l.split()[1]) for l in Path("/proc/meminfo").read_text().splitlines()
            if l.startswith(("MemTotal", "MemAvailable"))}
    return (info["MemTotal"] - info["MemAvailable"]) * 1024


class Cost:
    """What one launch costs the whole machine: busy CPU seconds (every process, ours and the workers', since
    descendants that are never reaped by their parent escape ``RUSAGE_CHILDREN``) and the peak of memory in use
    over what was in use at the start. Meaningful only on a machine otherwise idle; ``mark(name)`` records the CPU
    seconds so far (e.g. at every rank's first step)."""

    def __init__(self, period: float = 0.2, *, started: "Callable[[], bool] | None" = None) -> None:
        """``started``: polled every period until it is true, then ``mark("first_step")``."""
        self._cpu0, self._mem0 = _busy_seconds(), _used_bytes()
        self._started = started
        self.peak = 0
        self.marks: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, args=(period,), daemon=True)
        self._thread.start()

    def _sample(self, period: float) -> None:
        while not self._stop.wait(period):
            self.peak = max(self.peak, _used_bytes() - self._mem0)
            if self._started is not None and self._started():
                self.mark("first_step")
                self._started = None

    def mark(self, name: str) -> None:
        self.marks.setdefault(name, round(_busy_seconds() - self._cpu0, 1))

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join()
        self.mark("end")
        return {"cpu_s": self.marks, "peak_mem_gib": round(self.peak / 2**30, 2)}
