"""Per-cycle application logs (``--ft-per-cycle-applog-prefix``), as ft_launcher 0.6/0.7 writes them.

The format is in docs/logs.md: every rank's lines as ``<rank right-aligned>: <line>`` (UTF-8, undecodable
bytes replaced, NUL as ``<NUL>``), the driver's device-table dump left out as NVRx leaves it out. Nodes share
the file: each write is whole lines on an ``O_APPEND`` descriptor. A file that cannot be written is given
up with one warning; the job and the run folder logs go on.
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path
from typing import Callable

from mbr_launch.report.cycleinfo import cycle_log_file
from mbr_launch.report.private import open_private

LINE_CAP = 64 * 1024  # a line without end is written on in pieces of this size, never held whole

_DEVICE_HEADERS = frozenset({"Character devices:", "Block devices:"})
_DEVICE_ENTRY = re.compile(r"^\d{1,3}\s+[a-zA-Z0-9_\-/]+$")


def driver_noise(line: str) -> bool:
    """A line of the driver's /proc/devices dump (NVRx's filter: short lines only)."""
    if len(line) > 65:
        return False
    stripped = line.strip()
    return bool(stripped) and (stripped in _DEVICE_HEADERS or
                               (stripped[0].isdigit() and _DEVICE_ENTRY.match(stripped) is not None))


def rank_prefix(rank: int, world_size: int) -> str:
    width = len(str(world_size - 1)) if world_size > 1 else 0
    return f"{rank:>{width}}: " if width else f"{rank}: "


class _SharedFile:
    """One cycle's file, shared by the streams of this node's ranks (a lock orders their writes)."""

    def __init__(self, path: Path, failed: Callable[[Path, OSError], None]) -> None:
        self.path = path
        self.users = 0
        self._failed = failed
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._broken = False

    def write(self, data: bytes) -> None:
        with self._lock:
            if self._broken or not data:
                return
            try:
                if self._fd is None:
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                    self._fd = open_private(self.path, append=True)
                view = memoryview(data)
                while view:
                    view = view[os.write(self._fd, view):]
            except OSError as err:
                self._broken = True
                self._close()
                self._failed(self.path, err)

    def _close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                os.close(fd)
            except OSError:
                pass

    def close(self) -> None:
        with self._lock:
            self._close()


class CycleLogs:
    """The node's per-cycle files; ``sink`` gives each worker stream its writer."""

    def __init__(self, prefix: str, warn: Callable[[str], None]) -> None:
        self.prefix = prefix
        self._warn = warn
        self._lock = threading.Lock()
        self._files: dict[Path, _SharedFile] = {}
        self._warned = False

    def sink(self, cycle: int, rank: int, world_size: int) -> "CycleSink":
        path = Path(cycle_log_file(self.prefix, cycle))
        with self._lock:
            shared = self._files.get(path)
            if shared is None:
                shared = self._files[path] = _SharedFile(path, self._failed)
            shared.users += 1
        return CycleSink(shared, rank_prefix(rank, world_size), self._release)

    def _release(self, shared: _SharedFile) -> None:
        with self._lock:
            shared.users -= 1
            if shared.users > 0:
                return
            self._files.pop(shared.path, None)
        shared.close()

    def _failed(self, path: Path, err: OSError) -> None:
        with self._lock:
            if self._warned:
                return
            self._warned = True
        self._warn(f"WARNING: cannot write the per-cycle log {path}: {err}; the job goes on, the output is in "
                   "the run folder's logs and on the console as before")


class CycleSink:
    """One worker stream's lines into its cycle's file (on the stream's pump thread)."""

    def __init__(self, shared: _SharedFile, prefix: str, release: Callable[[_SharedFile], None]) -> None:
        self._shared, self._prefix, self._release = shared, prefix, release
        self._pending = bytearray()  # an unfinished line
        self._continued = False  # part of the pending line was written already (a line longer than LINE_CAP)
        self._closed = False

    def write(self, data: bytes) -> None:
        self._pending += data
        last = self._pending.rfind(b"\n")
        if last >= 0:
            self._shared.write(self._format(bytes(self._pending[:last + 1])))
            del self._pending[:last + 1]
            self._continued = False
        if len(self._pending) >= LINE_CAP:  # a line without end: write on, the rest follows unprefixed
            self._shared.write(self._format(bytes(self._pending), whole=False))
            self._pending.clear()
            self._continued = True

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._pending:
            self._shared.write(self._format(bytes(self._pending) + b"\n"))
            self._pending.clear()
        self._release(self._shared)

    def _format(self, block: bytes, *, whole: bool = True) -> bytes:
        text = block.decode("utf-8", errors="replace").replace("\x00", "<NUL>")
        lines = text.split("\n")
        tail = lines.pop()  # "" when the block ends with a newline
        out = []
        for i, line in enumerate(lines):
            first_continued = i == 0 and self._continued
            if not first_continued and driver_noise(line):
                continue
            out.append(line if first_continued else self._prefix + line)
        text = "".join(f"{line}\n" for line in out)
        if not whole and tail:
            text += tail if (self._continued and not lines) else self._prefix + tail
        return text.encode()

