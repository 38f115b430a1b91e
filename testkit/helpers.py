"""Helpers for tests that run the real launcher as a subprocess."""

from __future__ import annotations

import fcntl
import os
import signal
import socket
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

from testkit.postmortem import describe_session

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "tests" / "scripts"
LAUNCHER = [sys.executable, "-m", "mbr_launch"]
# torch's default MASTER_PORT: a stray torchrun or test job may hold it, so never hand it out.
DEFAULT_TORCH_PORT = 29500


def run_events(log_dir: Path) -> list[dict]:
    """The event log of the one run under ``log_dir`` (``<log_dir>/<run>/events.jsonl``), every record checked
    against the documented schema: a test that reads events also checks what it read is well formed."""
    from testkit.eventlog import read_events

    files = sorted(log_dir.glob("*/events.jsonl"))
    assert len(files) == 1, f"expected one run under {log_dir}, found {files}"
    records = read_events(files[0])
    for record in records:
        assert validate(record) == [], record
    return records


def validate(record: dict) -> list[str]:
    """Problems with one parsed event line against the documented schema (empty when it matches)."""
    from mbr_launch.report.events import EVENT_FIELDS

    problems = []
    for key in ("v", "ts", "t", "event", "node", "group_rank"):
        if key not in record:
            problems.append(f"missing {key}")
    event = record.get("event")
    if event not in EVENT_FIELDS:
        problems.append(f"unknown event {event!r}")
        return problems
    for name in EVENT_FIELDS[event]:
        if name not in record:
            problems.append(f"{event}: missing {name}")
    return problems


def read_dump(path: Path) -> tuple:
    """Per process group progress from one Flight Recorder dump file, read as the agent reads one; () when
    missing, too big, garbled or hostile."""
    from mbr_launch.workers.flightrec import load_checked, progress

    return progress(load_checked(path).data)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now (never 29500). Tests and benchmarks
    share this one helper (benchmarks/harness imports it from here)."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port != DEFAULT_TORCH_PORT:
            return port


def listener(port: int, pids: list[int]) -> int | None:
    """Which of ``pids`` listens on TCP ``port`` on this machine (the agent hosting the rendezvous store, when
    agents start at once and any may); None: none of them, or /proc could not tell."""
    from mbr_launch.cluster.listen import holds, listening_inodes

    inodes = listening_inodes(port)
    return next((pid for pid in pids if inodes and holds(pid, inodes)), None)


def launcher_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)
    env["PYTHONWARNINGS"] = "ignore"
    # A single-node launch without --master-port hosts its static store on torchrun's 29500, which
    # concurrent tests (and other users) collide on: every launch here gets its own port unless it says.
    env["PET_MASTER_PORT"] = str(free_port())
    env.update(extra)
    return env


def run_launcher(args: list[str], *, timeout: float = 90, env: dict[str, str] | None = None,
                 cwd: Path | None = None, launcher: list[str] = LAUNCHER) -> subprocess.CompletedProcess:
    """Run mbr-launch (or ``launcher``: torchrun, to compare) to completion; on timeout kill its whole session
    and fail loudly."""
    proc = subprocess.Popen([*launcher, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env or launcher_env(), cwd=cwd or REPO, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        state = describe_session(proc.pid, args)  # what it was doing, before it is killed
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"launcher timed out after {timeout} s\nstdout:\n{out}\nstderr:\n{err}\n"
                             f"processes of the session then:\n{state}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def start_launcher(args: list[str], *, env: dict[str, str] | None = None, **kw) -> subprocess.Popen:
    return subprocess.Popen([*LAUNCHER, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env or launcher_env(), cwd=REPO, start_new_session=True, **kw)


def run_on_pty(args: list[str], *, cols: int, rows: int, timeout: float) -> list[tuple[float, bytes]]:
    """Run the launcher with its stdout and stderr on a new pseudo-terminal; every read of the terminal's
    master side, with its time."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    proc = subprocess.Popen([*LAUNCHER, *args], stdin=subprocess.DEVNULL, stdout=slave, stderr=slave,
                            env=launcher_env(TERM="xterm-256color", COLUMNS=str(cols), LINES=str(rows)), cwd=REPO,
                            start_new_session=True)
    os.close(slave)
    reads: list[tuple[float, bytes]] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every writer of the terminal is gone
                break
            if not data:
                break
            reads.append((time.monotonic(), data))
        else:
            raise AssertionError(f"launcher still running after {timeout} s")
        assert proc.wait(10) == 0, b"".join(d for _, d in reads).decode(errors="replace")[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        os.close(master)
    return reads


def read_ready(fd: int) -> bytes:
    """What a pipe holds now (up to 1 MiB), without waiting: the console tests read their pipes after writing."""
    os.set_blocking(fd, False)
    try:
        return os.read(fd, 1 << 20)
    except BlockingIOError:
        return b""


def finish(proc: subprocess.Popen, timeout: float = 90) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"launcher timed out after {timeout} s\nstdout:\n{out}\nstderr:\n{err}")
