"""Whole lines appended to a log file that may fill up or fail: never a half line, never an exception. On an
I/O error the file is rolled back to its last complete line and given up; what it misses is counted.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Callable

from mbr_launch.report.private import open_private

Writer = Callable[[int, memoryview], int]


class LineAppender:
    """Appends whole lines to ``path``; only it writes there, so each complete write's end is the rollback point."""

    def __init__(self, path: Path, *, fresh: bool = False, write: Writer = os.write) -> None:
        self.path = path
        self._write = write
        self.error: OSError | None = None  # why the file was given up (None while it is written)
        self.lost_bytes = 0
        self.lost_lines = 0
        self._fd: int | None = None
        self._end = 0
        try:
            self._fd = open_private(path, fresh=fresh)
            self._end = os.fstat(self._fd).st_size
        except OSError as exc:
            self._give_up(exc)

    @property
    def ok(self) -> bool:
        return self.error is None

    def append(self, data: bytes) -> bool:
        """Write ``data`` (whole lines) completely, or not at all; False (and counted) when not."""
        if self._fd is None:
            self._count(data)
            return False
        view, done = memoryview(data), 0
        try:
            while done < len(data):
                n = self._write(self._fd, view[done:])
                if n <= 0:
                    raise OSError(f"write to {self.path} made no progress")
                done += n
        except OSError as exc:
            if done:
                self._roll_back()
            self._give_up(exc)
            self._count(data)
            return False
        self._end += done
        return True

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                os.close(fd)
            except OSError:
                pass  # nothing is buffered here: a failing close loses nothing more

    def _roll_back(self) -> None:
        try:
            os.ftruncate(self._fd, self._end)  # type: ignore[arg-type]
        except OSError:
            pass  # an I/O error may refuse this too; the next reader then sees the cut line as unfinished

    def _give_up(self, exc: OSError) -> None:
        if self.error is None:
            self.error = exc
        self.close()

    def _count(self, data: bytes) -> None:
        self.lost_bytes += len(data)
        self.lost_lines += data.count(b"\n") or 1


def describe(error: OSError | None) -> str:
    """``error`` as a short phrase: "No space left on device (ENOSPC)"."""
    if error is None:
        return ""
    name = errno.errorcode.get(error.errno or 0)
    return f"{error.strerror or error}" + (f" ({name})" if name else "")
