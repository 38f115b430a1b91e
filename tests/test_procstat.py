"""``mbr_launch.procstat`` on the real /proc: this process, children whose command name is built to fool a
parser ("a) b (c", a name that looks like the fields that follow it), a zombie, a reaped pid; and its three
users (the monitor's ancestry walk, the stop's process table, a hang's scheduler states) through it."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mbr_launch import procstat
from mbr_launch.decide.verdict import ProcState
from mbr_launch.monitor import ancestry
from mbr_launch.workers import evidence, strays

pytestmark = pytest.mark.timeout(60)

# Sets its own name (prctl PR_SET_NAME: at most 15 bytes), says it is ready on stdout, then sleeps.
NAMED = ("import ctypes, sys, time; ctypes.CDLL(None).prctl(15, sys.argv[1].encode(), 0, 0, 0); "
         "print('ready', flush=True); time.sleep(60)")
SLEEPER = "import time; print('ready', flush=True); time.sleep(60)"
HOSTILE = [
    "a) b (c",  # spaces and parentheses both ways
    ") Z 1 1 1 1 1",  # a fake state and fake parent/group/session after a ")"
    "x)\n(y) R 2",  # a newline: the stat line is not one line any more
    "))))",
]


def _child(argv: list[str], **kw) -> subprocess.Popen:
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, start_new_session=True, **kw)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    return proc


def _asleep(pid: int) -> procstat.Stat:
    """Its stat once it sleeps (it said "ready" just before ``time.sleep``: it may still be running)."""
    deadline = time.monotonic() + 20
    while (stat := procstat.read(pid)) is not None and stat.state != "S" and time.monotonic() < deadline:
        time.sleep(0.005)
    assert stat is not None and stat.state == "S", stat
    return stat


def _stop(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait()
    if proc.stdout:
        proc.stdout.close()


def test_this_process():
    me = procstat.read(os.getpid())
    assert me is not None
    assert (me.pid, me.ppid, me.pgid, me.session) == (os.getpid(), os.getppid(), os.getpgid(0), os.getsid(0))
    assert me.comm == Path("/proc/self/comm").read_text().rstrip("\n")
    assert me.state == "R" and not me.zombie  # it is reading its own stat: running
    assert me.cpu_ticks == me.utime + me.stime > 0
    assert 0 < me.start_time <= time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK") + 1


@pytest.mark.processes
@pytest.mark.parametrize("name", HOSTILE)
def test_a_hostile_command_name_does_not_shift_the_fields(name):
    proc = _child([sys.executable, "-c", NAMED, name])
    try:
        stat = _asleep(proc.pid)
        assert stat.comm == name
        assert (stat.pid, stat.ppid, stat.pgid, stat.session) == (proc.pid, os.getpid(), proc.pid, proc.pid)
        assert stat.state == "S"
        assert stat.start_time >= procstat.read(os.getpid()).start_time  # type: ignore[union-attr]
    finally:
        _stop(proc)


@pytest.mark.processes
def test_the_name_of_an_executed_symlink(tmp_path):
    link = tmp_path / "a) b (c"  # the kernel names a process after the file it executed
    link.symlink_to(sys.executable)
    proc = _child([str(link), "-c", SLEEPER])
    try:
        stat = _asleep(proc.pid)
        assert stat.comm == "a) b (c" and stat.ppid == os.getpid()
        # ... and the three users read it right too
        assert ancestry.parent_of(proc.pid) == os.getpid()
        assert ancestry.descends_from(proc.pid, {os.getpid()})
        table = strays.process_table()
        assert table[proc.pid] == strays.Proc(ppid=os.getpid(), pgid=proc.pid, zombie=False)
        assert proc.pid in strays.descendants(table, [os.getpid()])
        state = evidence.read_stat(proc.pid)
        assert state is not None and state[0] is ProcState.SLEEPING
    finally:
        _stop(proc)


@pytest.mark.processes
def test_scan_has_every_process_with_its_fields():
    proc = _child([sys.executable, "-c", NAMED, HOSTILE[1]])
    try:
        _asleep(proc.pid)
        table = procstat.scan()
        assert table[os.getpid()].ppid == os.getppid()
        assert table[proc.pid].comm == HOSTILE[1] and table[proc.pid].ppid == os.getpid()
        assert table[proc.pid].state == "S" and table[proc.pid].pgid == proc.pid
        assert all(pid == stat.pid for pid, stat in table.items())
    finally:
        _stop(proc)


@pytest.mark.processes
def test_a_zombie_then_a_reaped_pid():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 20
    while (stat := procstat.read(proc.pid)) is not None and not stat.zombie and time.monotonic() < deadline:
        time.sleep(0.01)  # exiting: a zombie until it is waited for
    assert stat is not None and stat.zombie and stat.state == "Z"
    assert strays.process_table()[proc.pid].zombie
    proc.wait()
    assert procstat.read(proc.pid) is None  # gone: None, not an exception
    assert ancestry.parent_of(proc.pid) is None
    assert not ancestry.descends_from(proc.pid, {os.getpid()})
    assert evidence.read_stat(proc.pid) is None
    assert evidence.sample([proc.pid], window=0.01) == {proc.pid: (ProcState.GONE, None)}


@pytest.mark.parametrize("pid", [0, -1, 2 ** 40])
def test_no_such_pid(pid):
    assert procstat.read(pid) is None


@pytest.mark.parametrize("raw", [b"", b"garbage", b"12 (x) S 1 2", b"12 (x", b"(x) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19",
                                 b"12 (x) S one 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19"])
def test_a_line_that_is_not_a_stat_line_is_none(raw):
    assert procstat.parse(raw) is None


def test_parse_splits_at_the_last_parenthesis():
    line = b"42 (a) b (c) S 7 8 9 0 0 0 0 0 0 0 11 12 0 0 20 0 1 0 99 0 0\n"
    assert procstat.parse(line) == procstat.Stat(pid=42, comm="a) b (c", state="S", ppid=7, pgid=8, session=9,
                                                 utime=11, stime=12, start_time=99)


def test_the_read_is_bounded(monkeypatch):
    sizes = []
    real = os.read

    def read(fd: int, n: int) -> bytes:
        sizes.append(n)
        return real(fd, n)

    monkeypatch.setattr(procstat.os, "read", read)
    assert procstat.read(os.getpid()) is not None
    assert sizes == [procstat.MAX_BYTES]


def test_unreadable_is_none(monkeypatch):
    def refuse(fd: int, n: int) -> bytes:
        raise OSError(3, "No such process")  # ESRCH: reaped between the open and the read

    monkeypatch.setattr(procstat.os, "read", refuse)
    assert procstat.read(os.getpid()) is None
    assert evidence.read_stat(os.getpid()) is None


def test_only_the_standard_library():
    # The rank monitor imports it (through monitor.ancestry) and must start in milliseconds.
    tree = ast.parse(Path(procstat.__file__).read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported


def test_the_three_private_parsers_are_gone():
    root = Path(procstat.__file__).parent
    for module in ("monitor/ancestry.py", "workers/strays.py", "workers/evidence.py"):
        text = (root / module).read_text()
        assert '/stat"' not in text and "rsplit" not in text and "procstat." in text, module


# ---- /proc/<pid>/environ ----------------------------------------------------------------------------------


@pytest.mark.processes
def test_a_childs_environment_as_it_was_at_exec():
    proc = _child([sys.executable, "-c", SLEEPER], env={"MBR_PROBE": "a=b c", "EMPTY": ""})
    try:
        env = procstat.environ(proc.pid)
        assert env is not None and b"MBR_PROBE=a=b c" in env and b"EMPTY=" in env and env[-1] == b""
        cut = procstat.environ(proc.pid, limit=5)
        assert cut is not None and b"\0".join(cut) == b"\0".join(env)[:5] == b"MBR_P"
    finally:
        proc.kill()
        proc.wait()
    assert procstat.environ(proc.pid) is None  # reaped: gone


@pytest.mark.parametrize("pid", [0, -1, 2**22 + 1, "1/../self"])
def test_no_such_pid_has_no_environment(pid):
    assert procstat.environ(pid) is None


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every process's environment")
def test_another_users_environment_is_none():
    assert os.stat("/proc/1").st_uid != os.geteuid()
    assert procstat.environ(1) is None


def test_the_environment_read_is_bounded(monkeypatch):
    sizes = []
    real = open

    class Spy:
        def __init__(self, f):
            self._f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self._f.close()

        def read(self, n=-1):
            sizes.append(n)
            return self._f.read(n)

    monkeypatch.setattr("builtins.open", lambda path, mode="r", *a, **k: Spy(real(path, mode, *a, **k)))
    assert procstat.environ(os.getpid())
    assert sizes == [procstat.MAX_ENVIRON]


def test_the_private_environment_readers_are_gone():
    root = Path(procstat.__file__).parent
    for module in ("workers/strays.py", "health/leftovers.py", "health/gpuowners.py", "doctor/processes.py"):
        text = (root / module).read_text()
        assert '"environ"' not in text and "/environ" not in text and "procstat.environ(" in text, module
