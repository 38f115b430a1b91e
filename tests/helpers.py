"""Helpers for tests that run the real launcher as a subprocess."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "tests" / "scripts"
LAUNCHER = [sys.executable, "-m", "mbr_launch"]


def launcher_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)
    env["PYTHONWARNINGS"] = "ignore"
    env.update(extra)
    return env


def run_launcher(args: list[str], *, timeout: float = 90, env: dict[str, str] | None = None,
                 cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run mbr-launch to completion; on timeout kill its whole session and fail loudly."""
    proc = subprocess.Popen([*LAUNCHER, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env or launcher_env(), cwd=cwd or REPO, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"launcher timed out after {timeout} s\nstdout:\n{out}\nstderr:\n{err}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def start_launcher(args: list[str], *, env: dict[str, str] | None = None, **kw) -> subprocess.Popen:
    return subprocess.Popen([*LAUNCHER, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env or launcher_env(), cwd=REPO, start_new_session=True, **kw)


def finish(proc: subprocess.Popen, timeout: float = 90) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"launcher timed out after {timeout} s\nstdout:\n{out}\nstderr:\n{err}")
