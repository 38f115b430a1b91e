"""Shared test fixtures.

Every process a test starts inherits ``MBR_TEST_SESSION``; after each test we look for processes that
still carry it (other than pytest itself) and fail the test if any survive, killing them so one leak does
not cascade into the next test.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

import pytest

from .helpers import free_port

# The Slurm test-cluster fixtures (slurm_cluster, slurm_clean) for every test module.
pytest_plugins = ["tests.slurm_cluster"]

MARKER = "MBR_TEST_SESSION"
# Cluster daemons started by the Slurm fixture legitimately outlive single tests.
_DAEMONS = {"slurmctld", "slurmd", "slurmstepd", "munged"}

os.environ.setdefault(MARKER, uuid.uuid4().hex)
REPO = Path(__file__).resolve().parents[1]


def _marked_pids() -> list[int]:
    token = f"{MARKER}={os.environ[MARKER]}".encode()
    me = os.getpid()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        if pid == me:
            continue
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes()
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if token not in env.split(b"\0") or comm in _DAEMONS:
            continue
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            continue  # zombies of ours are reaped by whoever owns them
        found.append(pid)
    return found


def leftover_processes(grace: float = 3.0) -> list[str]:
    """Processes started by this test session that are still alive after ``grace`` seconds."""
    deadline = time.monotonic() + grace
    while True:
        pids = _marked_pids()
        if not pids or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    described = []
    for pid in pids:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        described.append(f"{pid}: {cmd.strip()}")
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return described


# What ``cli.process.prepare`` sets for the launcher's own process: a test that calls it in pytest's process must not
# hand it to every later test's subprocesses.
_LAUNCHER_ONLY = ("TORCH_CPP_LOG_LEVEL", "RES_OPTIONS")


@pytest.fixture(autouse=True)
def launcher_only_environment():
    before = {name: os.environ.get(name) for name in _LAUNCHER_ONLY}
    yield
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(autouse=True)
def no_leftover_processes(request):
    yield
    if request.node.get_closest_marker("allow_leftovers"):
        return
    left = leftover_processes()
    assert not left, "processes left running after the test:\n" + "\n".join(left)


@pytest.fixture
def port() -> int:
    return free_port()


def pytest_configure(config):
    config.addinivalue_line("markers", "allow_leftovers: the test manages long-lived daemons itself")
    config.addinivalue_line("markers", "slurm: needs the local Slurm test cluster (root)")
    config.addinivalue_line("markers", "netns: needs network namespaces (root)")
