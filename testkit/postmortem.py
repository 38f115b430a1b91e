"""What a launcher that ran past a test's timeout was doing, read before its session is killed.

A test that times out says only that it did: the processes are killed and the run folder is a temporary one.
This reads, while they still run, every process of the session and every descendant of the launcher (state,
kernel wait channel, command line, its threads'), the Python stacks of each (py-spy, a test dependency; skipped where it cannot attach) and the tail
of the run folder's events, so a flake on a CI machine leaves what is needed to find it.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from mbr_launch import procstat
from mbr_launch.workers.stacks import find_py_spy

EVENTS_TAIL = 30  # lines of events.jsonl
SPY_TIMEOUT = 10.0  # seconds per process


def _read(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read(4096).decode(errors="replace").replace("\0", " ").strip()
    except OSError:
        return "?"


def session_pids(sid: int) -> list[int]:
    """The processes of session ``sid`` and every descendant of its leader: the fork server, the rank monitor
    and the workers forked from the server run in sessions of their own."""
    table = procstat.scan()
    pids = {pid for pid, stat in table.items() if stat.session == sid}
    grown = True
    while grown:
        children = {pid for pid, stat in table.items() if stat.ppid in pids} - pids
        grown = bool(children)
        pids |= children
    return sorted(pids)


def _threads(pid: int) -> list[str]:
    lines = []
    try:
        tids = sorted(os.listdir(f"/proc/{pid}/task"), key=int)
    except OSError:
        return lines
    for tid in tids:
        base = f"/proc/{pid}/task/{tid}"
        stat = procstat.parse(_read(base + "/stat").encode())
        lines.append(f"    thread {tid} {_read(base + '/comm')}: {stat.state if stat else '?'} "
                     f"wchan={_read(base + '/wchan')}")
    return lines


def _python_stacks(pid: int) -> str:
    spy = find_py_spy()
    if spy is None:
        return "    (py-spy not installed)"
    try:
        res = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True,
                             timeout=SPY_TIMEOUT)
    except subprocess.TimeoutExpired:
        return "    (py-spy timed out)"
    text = (res.stdout or res.stderr).strip()
    return "\n".join("    " + line for line in text.splitlines()[-80:])


def _events_tail(args: list[str]) -> str:
    if "--log-dir" not in args or args.index("--log-dir") + 1 >= len(args):
        return ""
    root = Path(args[args.index("--log-dir") + 1])
    lines = []
    for events in sorted(root.glob("*/events.jsonl")):
        tail = events.read_text(errors="replace").splitlines()[-EVENTS_TAIL:]
        lines += [f"{events}:", *("  " + line[:400] for line in tail)]
    return "\n".join(lines)


def describe_session(sid: int, args: list[str]) -> str:
    """Every process of session ``sid`` (its leader is the launcher), with threads and stacks, and the tail of
    the run's events; for a test's failure message. Never raises."""
    parts = []
    try:
        for pid in session_pids(sid):
            stat = procstat.read(pid)
            if stat is None:
                continue  # ended meanwhile
            parts.append(f"pid {pid} (parent {stat.ppid}) {stat.state} wchan={_read(f'/proc/{pid}/wchan')}: "
                         f"{_read(f'/proc/{pid}/cmdline')[:300]}")
            parts += _threads(pid)
            if not stat.zombie:
                parts.append(_python_stacks(pid))
        parts.append(_events_tail(args))
    except Exception as err:  # noqa: BLE001 - a post-mortem must not hide the failure it describes
        parts.append(f"(post-mortem failed: {type(err).__name__}: {err})")
    return "\n".join(p for p in parts if p)
