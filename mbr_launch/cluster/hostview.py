"""What this machine tells of liveness (``decide.liveness`` judges it): identities, and own time.

Own time is ticked by one daemon thread per process, read by every watcher, so a process starved of CPU
counts less silence everywhere at once.
"""

from __future__ import annotations

import os
import threading
import time
from functools import lru_cache

from mbr_launch import procstat
from mbr_launch.cluster.listen import holds, listening_inodes
from mbr_launch.cluster.torch_internals import matches_this_machine
from mbr_launch.decide.liveness import Identity, OwnTime, Seen

TICK = 0.25  # seconds between own-time ticks: small against any timeout, and 4 cheap wake-ups a second


@lru_cache(maxsize=1)
def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read(64).strip()
    except OSError:
        return ""


def _namespace(name: str) -> int:
    try:
        return os.stat(f"/proc/self/ns/{name}").st_ino
    except OSError:
        return 0


def my_identity() -> Identity | None:
    """This process's identity, or None where /proc does not tell it (then nobody checks it locally)."""
    return _identity(os.getpid())


@lru_cache(maxsize=1)
def _identity(pid: int) -> Identity | None:  # by pid: a forked child is another process
    return _identity_of(pid)


def seen(identity: Identity | None, me: Identity | None) -> Seen:
    """ALIVE when ``identity`` is a running or sleeping process on this machine; else SILENT."""
    if identity is None or me is None or not me.same_machine(identity):
        return Seen.SILENT
    stat = procstat.read(identity.pid)
    if stat is None or stat.start_time != identity.start_time or stat.zombie or stat.state in ("T", "t"):
        return Seen.SILENT
    return Seen.ALIVE


def listener(host: str, port: int) -> Identity | None:
    """The local process listening on ``host``:``port`` (the store's agent, known before the store answers);
    None when not here. Reads every process's descriptors: call only after a silence."""
    inodes = listening_inodes(port) if port > 0 else set()
    if not inodes or not matches_this_machine(host):
        return None
    return next((_identity_of(int(name)) for name in os.listdir("/proc") if name.isdigit() and holds(name, inodes)),
                None)


def _identity_of(pid: int) -> Identity | None:
    stat = procstat.read(pid)
    boot = _boot_id()
    if stat is None or not boot:
        return None
    return Identity(boot, _namespace("pid"), _namespace("net"), pid, stat.start_time)


class OwnClock:
    def __init__(self, period: float = TICK) -> None:
        self._own = OwnTime(time.monotonic(), period)
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="own-time", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            time.sleep(self._own.period)
            self.now()

    def now(self) -> float:
        """Own seconds so far (also ticks, so a reader never sees a stale value)."""
        with self._lock:
            return self._own.tick(time.monotonic())


_CLOCK: OwnClock | None = None
_START = threading.Lock()


def own_time() -> float:
    """This process's own time (``decide.liveness.OwnTime``); starts the ticking thread at first use."""
    global _CLOCK
    if _CLOCK is None:
        with _START:
            if _CLOCK is None:
                _CLOCK = OwnClock()
    return _CLOCK.now()
