"""Worker processes: spawn, watch, stop.

Each worker starts in its own session (the whole process group can be signalled) with a parent-death
signal (a SIGKILLed agent cannot orphan it); exits are observed through pidfds, with no polling.
"""

from __future__ import annotations

import collections
import ctypes
import json
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Callable, Sequence

from mbr_launch.contract import preemption_signals
from mbr_launch.fdwait import ready
from mbr_launch.report.exitstatus import ExitStatus
from mbr_launch.report.private import write_private
from mbr_launch.workers import strays

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


@dataclass
class WorkerSpec:
    local_rank: int
    rank: int
    argv: Sequence[str]
    env: dict[str, str]
    stdout: BinaryIO | int | None  # None: inherit; a file or subprocess.PIPE
    stderr: BinaryIO | int | None


TAIL_LINES = 40


@dataclass
class Worker:
    spec: WorkerSpec
    proc: subprocess.Popen
    pidfd: int
    started: float
    status: ExitStatus | None = None
    ended: float | None = None
    pumps: list[threading.Thread] = field(default_factory=list)
    # The last lines of its stderr (kept by its pump): why it died, when the error names a collective timeout.
    tail: collections.deque[bytes] = field(default_factory=lambda: collections.deque(maxlen=TAIL_LINES))
    noticed: bool = False  # the agent has seen (and logged) this worker's exit
    standby_age: float | None = None  # seconds it waited as a warm standby (None: started fresh)
    standby_state: str | None = None  # how far that standby was when taken (StandbyPool.state)
    # A stop took it down and cleaned up after it: another stop has nothing to do (a restarted rank is a new Worker).
    stopped: bool = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def local_rank(self) -> int:
        return self.spec.local_rank

    @property
    def rank(self) -> int:
        return self.spec.rank

    @property
    def alive(self) -> bool:
        return self.status is None

    def reap(self) -> ExitStatus | None:
        """Collect the exit status if the process has ended (non-blocking)."""
        if self.status is None:
            code = self.proc.poll()
            if code is not None:
                self.status = ExitStatus.from_returncode(code)
                self.ended = time.monotonic()
                try:
                    os.close(self.pidfd)
                except OSError:
                    pass
        return self.status


def _child_setup(parent_pid: int, ignore: Sequence[int] = ()) -> Callable[[], None]:
    def setup() -> None:
        # Between fork and exec. The death signal fires when the *thread* that forked exits: spawn from main.
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:  # the agent died before prctl took effect
            os._exit(1)
        # Ignored signals stay ignored across exec: no window before boot ignores Slurm's preemption signals.
        for sig in ignore:
            signal.signal(sig, signal.SIG_IGN)

    return setup


def spawn(spec: WorkerSpec, *, cwd: str | None = None, pass_fds: Sequence[int] = ()) -> Worker:
    proc = subprocess.Popen(
        list(spec.argv),
        env=spec.env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=spec.stdout,
        stderr=spec.stderr,
        start_new_session=True,
        preexec_fn=_child_setup(os.getpid(), preemption_signals(spec.env)),
        close_fds=True,
        pass_fds=tuple(pass_fds),
    )
    return Worker(spec=spec, proc=proc, pidfd=os.pidfd_open(proc.pid), started=time.monotonic())


def write_rank_map(run_dir: Path, *, round_index: int, restart_count: int, world_size: int,
                   workers: Sequence[Worker]) -> None:
    """Replace ``<run_dir>/ranks.json``, which pid is which rank now, for tools that look at processes (a rank
    born from a standby has no ``RANK`` in ``/proc/PID/environ``); a full disk leaves the old one."""
    record = {"round": round_index, "restart_count": restart_count, "world_size": world_size,
              "ranks": [{"rank": w.rank, "local_rank": w.local_rank, "pid": w.pid}
                        for w in sorted(workers, key=lambda w: w.local_rank)]}
    path, tmp = run_dir / "ranks.json", run_dir / ".ranks.json.tmp"
    try:
        write_private(tmp, (json.dumps(record) + "\n").encode())
        os.replace(tmp, path)
    except OSError:
        pass


def signal_group(worker: Worker, sig: int) -> None:
    """Signal the worker's whole process group; a group already gone is not an error."""
    try:
        os.killpg(worker.pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(worker.pid, sig)
        except ProcessLookupError:
            pass


def wait_any(workers: Sequence[Worker], timeout: float | None) -> list[Worker]:
    """Block until at least one live worker exits or ``timeout`` passes; returns the ones that ended."""
    live = {w.pidfd: w for w in workers if w.alive}
    if not live:
        return []
    ended = []
    for fd in ready(list(live), timeout):
        worker = live[fd]
        if worker.reap() is not None:
            ended.append(worker)
    return ended


# Strays finder for a stop: (process table, pids) of descendants the group signals may miss (``strays.py``).
FindStrays = Callable[[], "tuple[dict[int, strays.Proc], set[int]]"]
PUMP_DRAIN = 1.0  # seconds, for all pumps of a stop together, to copy what the dead workers wrote last
# Called about every STOP_TICK s with (workers stopping, those alive, grace left); True: SIGKILL now.
StopWatch = Callable[[Sequence[Worker], Sequence[Worker], float], bool]
STOP_TICK = 0.2


def stop_all(workers: Sequence[Worker], *, first_signal: int = signal.SIGTERM, grace: float = 30.0,
             on_escalate: Callable[[Worker], None] | None = None, find_strays: FindStrays | None = None,
             watch: StopWatch | None = None) -> None:
    """Staged stop: ``first_signal`` to every group, wait up to ``grace``, then SIGKILL what is left (groups
    too, after the leader exited). Strays get the same signals and a short grace once the workers are gone;
    the pumps one short shared drain, so a pipe an escaped process holds never holds a stop."""
    targets = list(workers)
    found = strays.Strays(groups={w.pid for w in targets})
    if find_strays:
        found.add(*find_strays())  # before any signal, while the process tree is intact
    # The signal first, SIGCONT after: resumed first, a stopped culprit ran on between the two calls; pending
    # when it resumes, the signal is taken before any more of its code runs.
    for worker in targets:
        if worker.alive:
            signal_group(worker, first_signal)
            signal_group(worker, signal.SIGCONT)
    found.signal(first_signal)
    found.signal(signal.SIGCONT)
    deadline = time.monotonic() + grace
    cut = False
    while any(w.alive for w in targets):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        if watch and watch(targets, [w for w in targets if w.alive], remaining):
            cut, deadline = True, time.monotonic()  # the watch said why; no grace left for strays either
            break
        wait_any(targets, min(remaining, STOP_TICK) if watch else remaining)
    for worker in targets:
        if worker.alive and on_escalate and not cut:
            on_escalate(worker)
        signal_group(worker, signal.SIGKILL)
    if find_strays:
        found.add(*find_strays())  # forked or orphaned since
        found.wait(max(0.0, min(strays.STRAY_GRACE, deadline - time.monotonic())))
    found.signal(signal.SIGKILL, everyone=True)
    for worker in targets:
        if worker.alive:
            worker.proc.wait()
            worker.reap()
    found.wait(5.0)  # SIGKILLed: only a process stuck in the kernel (D state) takes longer
    found.close()
    drain_until = time.monotonic() + PUMP_DRAIN
    for worker in targets:
        for pump in worker.pumps:
            pump.join(timeout=max(0.0, drain_until - time.monotonic()))
