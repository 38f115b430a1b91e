"""Launcher processes on this host, read from /proc: which other launchers run (``launcher.per_node``) and
who started this process (``detect_launcher``).

/proc is read directly rather than through psutil: every agent scans the host before its ranks start, and
psutil (an object and three files per process, a second pass for our children, and its import) took about
3% of an agent's CPU when 32 agents started together on 2 cores. One ``cmdline`` is read per process; the
rest only for the few that are launchers.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from mbr_launch import procstat
from mbr_launch.monitor.ancestry import MAX_HOPS, parent_of

_LAUNCHER_MARKERS = (
    ("ft_launcher", "ft_launcher"),
    ("mbr-launch", "mbr-launch"),
    ("mbr_launch", "mbr-launch"),
    ("torchrun", "torchrun"),
    ("torch.distributed.run", "torchrun"),
    ("torch.distributed.launch", "torchrun"),
)


# Thread names of a launcher's helper processes (a waiting standby, the rank monitor): not launchers.
_HELPER_NAMES = ("mbr-standby", "mbr-monitor", "mbr-forkserver")


def launcher_of(cmdline: Sequence[str]) -> str | None:
    """Which launcher a command line is, judged by its first three words (python -m X, or X itself)."""
    for word in cmdline[:3]:
        base = os.path.basename(word)
        for marker, name in _LAUNCHER_MARKERS:
            if base == marker or word == marker:
                return name
    return None


def parent_cmdlines(limit: int = 8) -> list[list[str]]:
    """The command lines of the processes above this one, nearest first."""
    out: list[list[str]] = []
    pid = parent_of(os.getpid())
    while pid is not None and pid > 0 and len(out) < limit:
        raw = _read_proc(pid, "cmdline")
        if raw is None:
            break
        out.append(_split_cmdline(raw) if raw else [])
        pid = parent_of(pid)
    return out


def detect_launcher(env: Mapping[str, str], parents: Sequence[Sequence[str]] | None = None) -> str:
    """Who started this process: mbr-launch, ft_launcher, torchrun, srun, or "none".

    Env first (it survives wrapper scripts): our agent exports MBR_* and ft_launcher exports
    FT_RANK_MONITOR_IPC_SOCKET; TORCHELASTIC_RUN_ID without either means plain torchrun. Then the
    parents' command lines, for a torchrun that has not exported anything recognisable.
    """
    if any(k.startswith("MBR_") and k != "MBR_TEST_SESSION" for k in env):
        return "mbr-launch"
    if "FT_RANK_MONITOR_IPC_SOCKET" in env or "FT_LAUNCHER_IPC_SOCKET" in env:
        return "ft_launcher"
    if "TORCHELASTIC_RUN_ID" in env:
        return "torchrun"
    for cmd in parent_cmdlines() if parents is None else parents:
        name = launcher_of(cmd)
        if name is not None:
            return name
    if "SLURM_STEP_ID" in env:
        return "srun"
    return "none"


@dataclass(frozen=True)
class LauncherProcess:
    """Another launcher process on this host, as ``launcher.per_node`` judges it."""

    pid: int
    uid: int | None  # None: unknown (the process went away while being read)
    argv: tuple[str, ...]
    # Its CUDA_VISIBLE_DEVICES; None when unset (every GPU) or when its environment cannot be read
    # (another user's process), ``env_read`` says which.
    visible_devices: str | None = None
    env_read: bool = False


def other_launchers() -> list[LauncherProcess]:
    """Launcher agents on this host outside our own process tree, whoever runs them and whatever they do
    (``launcher.per_node`` decides which ones matter)."""
    me = os.getpid()
    mine = _ancestors(me)
    seen: dict[int, bool] = {}  # pid -> descends from us: the launchers of one job share their parents
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        raw = _read_proc(pid, "cmdline")
        if pid in mine or not raw or not any(marker in raw for marker in _MARKER_BYTES):
            continue
        cmd = _split_cmdline(raw)
        # A worker of another launcher runs mbr_launch.shim.boot, not a launcher: only count agents. A waiting
        # standby shows as "mbr-launch standby ..." (shim.proctitle), a launcher's rank monitor and fork server,
        # forked from it, by their thread names (monitor.link, workers.forkserver) even where their titles
        # could not be written.
        if (launcher_of(cmd) is None or "mbr_launch.shim.boot" in cmd or cmd[:2] == ["mbr-launch", "standby"]
                or (_read_proc(pid, "comm") or b"").strip().decode(errors="replace") in _HELPER_NAMES
                or _descends(pid, me, seen)):
            continue
        environ = procstat.environ(pid)  # None: another user's process, its environment is private
        devices = None
        for item in environ or ():
            if item.startswith(b"CUDA_VISIBLE_DEVICES="):
                devices = item.split(b"=", 1)[1].decode(errors="replace")
        found.append(LauncherProcess(pid, _real_uid(pid), tuple(cmd), devices, environ is not None))
    return found


_MARKER_BYTES = tuple(marker.encode() for marker, _ in _LAUNCHER_MARKERS)


def _read_proc(pid: int, name: str) -> bytes | None:
    try:
        with open(f"/proc/{pid}/{name}", "rb") as f:
            return f.read()
    except OSError:  # gone meanwhile, or not ours to read
        return None


def _split_cmdline(raw: bytes) -> list[str]:
    """A process's argv as ``ps`` shows it: NUL-separated, or split at spaces where the process rewrote its
    title as one string (``mbr-launch standby for local rank 0``, setproctitle)."""
    text = raw.decode(errors="replace")
    sep = "\0" if text.endswith("\0") else " "
    words = text.rstrip(sep).split(sep)
    return text.rstrip(sep).split(" ") if sep == "\0" and len(words) == 1 and " " in words[0] else words


def _descends(pid: int, root: int, seen: dict[int, bool]) -> bool:
    """``pid`` is ``root`` or below it; every process walked through is remembered in ``seen``."""
    chain = []
    answer = False
    for _ in range(MAX_HOPS):
        if pid in seen:
            answer = seen[pid]
            break
        if pid == root or pid <= 1:
            answer = pid == root
            break
        chain.append(pid)
        parent = parent_of(pid)
        if parent is None:
            break
        pid = parent
    seen.update(dict.fromkeys(chain, answer))
    return answer


def _ancestors(pid: int) -> set[int]:
    """``pid`` and every process above it."""
    found = {pid}
    for _ in range(MAX_HOPS):
        parent = parent_of(pid)
        if parent is None or parent <= 0 or parent in found:
            break
        found.add(pid := parent)
    return found


def _real_uid(pid: int) -> int | None:
    for line in (_read_proc(pid, "status") or b"").splitlines():
        if line.startswith(b"Uid:"):
            return int(line.split()[1])
    return None  # gone while being read
