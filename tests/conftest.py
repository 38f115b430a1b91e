"""Shared test fixtures.

Every process a test starts inherits ``MBR_TEST_SESSION``; after each test we look for processes that
still carry it (other than pytest itself) and fail the test if any survive, killing them so one leak does
not cascade into the next test.

Two tiers. A test that starts any process (a launcher, a worker, an NVRx client, a Slurm daemon, a
``sleep``) carries the ``processes`` marker (``slurm`` and ``netns`` imply it); the rest run in pytest's
process alone, in seconds: ``pytest -m "not processes"``. The marker is enforced, not trusted: a test
without it that starts a process fails, saying so.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from testkit.helpers import free_port

# The Slurm test-cluster fixtures (slurm_cluster, slurm_clean) for every test module.
pytest_plugins = ["testkit.slurm_cluster"]

MARKER = "MBR_TEST_SESSION"
# Cluster daemons started by the Slurm fixture legitimately outlive single tests.
_DAEMONS = {"slurmctld", "slurmd", "slurmstepd", "munged"}

# Under pytest-xdist (scripts/test runs two workers) each worker process has its own token and its own temp
# dir: one worker's leftover check must never take the other's running launchers for leftovers, and launches
# without --log-dir must not share (and prune) one default run folder.
WORKER = os.environ.get("PYTEST_XDIST_WORKER")
WORKER_TMPDIR: str | None = None  # removed when this worker's session ends
if WORKER:
    os.environ[MARKER] = uuid.uuid4().hex
    os.environ["TMPDIR"] = WORKER_TMPDIR = tempfile.mkdtemp(prefix=f"mbr-{WORKER}-")
    os.chmod(os.environ["TMPDIR"], 0o1777)  # as /tmp is: tests run fakes as another user from under it
    tempfile.tempdir = None  # read TMPDIR again
else:
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
# And what ``cluster.rendezvous`` sets before a join (a test that joins in-process made every later launch's
# workers see TORCHELASTIC_USE_AGENT_STORE=False).
_LAUNCHER_ONLY = ("TORCH_CPP_LOG_LEVEL", "RES_OPTIONS", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE")


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


# Markers that mean "this test starts processes".
PROCESS_MARKERS = ("processes", "slurm", "netns")
_may_spawn = {"now": True}  # outside a test's run (collection, session set-up): allowed


def _refuse_if_unmarked(what: str) -> None:
    if not _may_spawn["now"]:
        pytest.fail(f"this test starts a process ({what}) but is not marked: add @pytest.mark.processes "
                    "(the fast tier, -m 'not processes', must start none)", pytrace=False)


_popen_init = subprocess.Popen.__init__
_fork = os.fork
_posix_spawn = os.posix_spawn


def _guarded_popen_init(self, args, *rest, **kwargs):  # type: ignore[no-untyped-def]
    _refuse_if_unmarked(str(args)[:120])
    _popen_init(self, args, *rest, **kwargs)


def _guarded_fork() -> int:
    _refuse_if_unmarked("os.fork")
    return _fork()


def _guarded_posix_spawn(path, *rest, **kwargs):  # type: ignore[no-untyped-def]
    _refuse_if_unmarked(f"os.posix_spawn {path}")
    return _posix_spawn(path, *rest, **kwargs)


subprocess.Popen.__init__ = _guarded_popen_init  # type: ignore[method-assign]
os.fork = _guarded_fork
os.posix_spawn = _guarded_posix_spawn


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _may_spawn["now"] = any(item.get_closest_marker(name) for name in PROCESS_MARKERS)
    try:
        yield
    finally:
        _may_spawn["now"] = True


def pytest_collection_modifyitems(config, items):
    """Under xdist's --dist loadgroup, the tests of the one local Slurm cluster and of network namespaces run
    on one worker: they share machine-wide daemons and namespace names.

    Then the order: real-process tests first, the longest time limit first (a test's limit follows how long it
    runs), the fast tier last. xdist hands tests out in this order, so the last ones handed out are short and the
    workers end together instead of two waiting while one runs a minute-long test it took last."""
    for item in items:
        if item.get_closest_marker("slurm") or item.get_closest_marker("netns"):
            item.add_marker(pytest.mark.xdist_group("root-cluster"))
    items.sort(key=lambda item: -_time_limit(item) if item.get_closest_marker("processes") else 0)


def _time_limit(item) -> float:
    marker = item.get_closest_marker("timeout")
    if marker is not None and marker.args:
        return float(marker.args[0])
    return float(item.config.getini("timeout") or 0)


def pytest_sessionfinish(session, exitstatus):
    if WORKER_TMPDIR is not None:
        shutil.rmtree(WORKER_TMPDIR, ignore_errors=True)


def _warm_matplotlib_font_cache() -> None:
    """Build matplotlib's font list before any test runs, where starting a process is allowed.

    matplotlib writes the list to MPLCONFIGDIR on first use and runs ``fc-list`` to make it: a test that renders
    a report on a machine (or a CI run with empty caches) that never ran matplotlib would otherwise start that
    process inside the fast tier, and pass or fail by what an earlier run left behind.
    """
    import importlib.util

    if importlib.util.find_spec("matplotlib") is not None:
        import matplotlib.font_manager  # noqa: F401  (loads the list, or builds and saves it)


def pytest_configure(config):
    _warm_matplotlib_font_cache()
    config.addinivalue_line("markers", "processes: starts real processes (the slow tier); -m 'not processes' "
                                       "runs the rest in seconds")
    config.addinivalue_line("markers", "xdist_group(name): pytest-xdist runs the tests of one group on one worker")
    config.addinivalue_line("markers", "allow_leftovers: the test manages long-lived daemons itself")
    config.addinivalue_line("markers", "slurm: needs the local Slurm test cluster (root)")
    config.addinivalue_line("markers", "netns: needs network namespaces (root)")
    config.addinivalue_line("markers", "reference: runs a peer launcher alone, to show that what a table asserts is "
                            "the peer's own behaviour; run by hand (-m reference), not in CI: it tests no code of ours")
