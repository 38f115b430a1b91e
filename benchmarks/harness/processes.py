"""Processes with deadlines and cleanup: one launcher run in its own session, exits seen through pidfds,
and the kill of everything a trial started.

Every process a benchmark starts carries ``MBR_BENCH_SESSION=<token>`` in its environment (launchers pass
their environment on to their workers), so cleanup finds the whole tree even when a launcher died and left
orphans in sessions of their own: ``kill_marked`` SIGKILLs every process group and process that carries
the token. Launchers and workers always start in a new session; nothing here signals our own group."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Callable

from .failures import failure_reason
from .launchers import Launcher, LaunchSpec
from .timing import read_ready

MARKER = "MBR_BENCH_SESSION"


def bench_env(token: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)  # each launcher applies its own default
    env.pop("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", None)
    env["PYTHONWARNINGS"] = "ignore"  # pynvml's deprecation warning under ft_launcher, on every start
    env[MARKER] = token
    env.update(extra or {})
    return env


class Proc:
    """One launcher run in its own session; stdout/stderr go to files (no pipes to fill up).

    The working directory is the trial's, never the repository: ``python -m`` puts the working directory
    first on sys.path, which would put the live source tree ahead of a --mbr-source snapshot."""

    def __init__(self, argv: list[str], *, env: dict[str, str], out_dir: Path, name: str) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        self.argv = argv
        self.stdout_path, self.stderr_path = out_dir / f"{name}.stdout", out_dir / f"{name}.stderr"
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.t0_wall = time.time()
            self.t0 = time.monotonic()
            self.popen = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env,
                                          cwd=out_dir, start_new_session=True)
        self.pidfd = os.pidfd_open(self.popen.pid)
        self.t_exit: float | None = None  # monotonic

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    def poll(self) -> int | None:
        if self.popen.returncode is None and self.popen.poll() is not None:
            self.t_exit = time.monotonic()
        return self.popen.returncode

    def wait_exit(self, timeout: float) -> int | None:
        """Wait for the exit with a pidfd (exact exit time, no sleep-poll granularity); None on timeout."""
        if self.poll() is not None:
            return self.returncode
        ready, _, _ = select.select([self.pidfd], [], [], max(0.0, timeout))
        if ready:
            self.t_exit = time.monotonic()
            self.popen.wait()
        return self.returncode

    def kill_session(self) -> None:
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    def close(self) -> None:
        os.close(self.pidfd)

    def stderr_size(self) -> int:
        try:
            return self.stderr_path.stat().st_size
        except OSError:
            return 0

    def stderr_tail(self, lines: int = 8, *, since: int = 0) -> list[str]:
        try:
            with open(self.stderr_path, "rb") as f:
                f.seek(since)
                text = f.read().decode(errors="replace")
        except OSError:
            return []
        return [ln for ln in text.splitlines() if ln.strip()][-lines:]


class ExitWatch:
    """time.time() at which a process (not our child) exits, from a pidfd, in a thread."""

    def __init__(self, pid: int, timeout: float) -> None:
        self.t_gone: float | None = None
        try:
            self._fd = os.pidfd_open(pid)
        except ProcessLookupError:
            self._fd = None
            self.t_gone = time.time()
            return
        self._thread = threading.Thread(target=self._wait, args=(timeout,), daemon=True)
        self._thread.start()

    def _wait(self, timeout: float) -> None:
        assert self._fd is not None
        ready, _, _ = select.select([self._fd], [], [], timeout)
        if ready:
            self.t_gone = time.time()
        os.close(self._fd)


def marked_pids(token: str) -> list[int]:
    """Live processes (not zombies) whose environment carries our token."""
    needle = f"{MARKER}={token}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            env = Path(f"/proc/{entry.name}/environ").read_bytes()
            state = Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and needle in env.split(b"\0"):
            found.append(int(entry.name))
    return found


def kill_marked(token: str, *, deadline_s: float = 10.0) -> int:
    """SIGKILL every process (and its process group) carrying the token; returns how many were alive."""
    own_group = os.getpgid(0)
    first = marked_pids(token)
    pids, end = first, time.monotonic() + deadline_s
    while pids and time.monotonic() < end:
        for pid in pids:
            try:
                pgid = os.getpgid(pid)
                if pgid != own_group:
                    os.killpg(pgid, signal.SIGKILL)
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.05)
        pids = marked_pids(token)
    return len(first)


def end_agents(procs: "list[Proc]", token: str, rec: dict) -> None:
    """Kill what is left of a many-agent trial: each agent's session, then whatever still carries the token
    (counted in ``rec["leftovers"]``); close the pidfds."""
    for p in procs:
        if p.poll() is None:
            p.kill_session()
    left = kill_marked(token)
    if left:
        rec["leftovers"] = left
        # Hundreds of processes on a starved machine can outlast kill_marked's deadline: the next trial must know.
        if alive := len(marked_pids(token)):
            rec["still_alive"] = alive
    for p in procs:
        p.close()


def stop_on_sigterm() -> None:
    """SIGTERM (e.g. from `timeout`) unwinds like Ctrl-C, so every open Trial kills its processes."""
    def handler(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, handler)


class Trial:
    """One launch with cleanup: ``with Trial(...) as t:`` always kills what is left of the launch."""

    def __init__(self, launcher: Launcher, spec_for: Callable[[Path], LaunchSpec], root: Path, index: int):
        self.launcher = launcher
        self.dir = root / f"{index:03d}-{launcher.name}"
        self.dir.mkdir(parents=True)
        self.ready_file = self.dir / "ready"
        self.spec = spec_for(self.dir)
        self.token = uuid.uuid4().hex
        self.proc: Proc | None = None
        self.leftovers = 0  # processes still alive after the launcher itself exited

    def __enter__(self) -> "Trial":
        env = bench_env(self.token, self.launcher.env)
        self.proc = Proc(self.launcher.argv(self.spec), env=env, out_dir=self.dir, name="launcher")
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.proc
        if self.proc.poll() is not None:
            self.leftovers = len(marked_pids(self.token))
        self.proc.kill_session()
        kill_marked(self.token)
        self.proc.close()


def run_to_exit(launcher: Launcher, spec_for: Callable[[Path], LaunchSpec], root: Path, index: int, *,
                timeout: float) -> dict:
    """Launch, wait for the exit: rc, wall time (launch -> exit), ready lines, reason when it failed."""
    rec: dict = {"launcher": launcher.name, "trial": index, "rc": None, "wall": None, "ready": [], "reason": ""}
    with Trial(launcher, spec_for, root, index) as t:
        assert t.proc
        rc = t.proc.wait_exit(timeout)
        rec["rc"], rec["t0_wall"] = rc, t.proc.t0_wall
        rec["ready"] = read_ready(t.ready_file)
        if rc is None:
            rec["reason"] = failure_reason(t.proc, f"hang: no exit within {timeout:.0f} s")
        else:
            assert t.proc.t_exit is not None
            rec["wall"] = t.proc.t_exit - t.proc.t0
            if rc != 0:
                rec["reason"] = failure_reason(t.proc, f"exit code {rc}")
    rec["leftovers"], rec["dir"] = t.leftovers, str(t.dir)
    return rec
