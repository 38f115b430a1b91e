"""The machine and software a report was measured on, and quiet helpers for outside commands."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
from datetime import datetime, timezone
from pathlib import Path

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
