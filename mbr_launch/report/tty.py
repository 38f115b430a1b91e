"""The launcher's output devices at the level of file descriptors: which fds are one device, whether it is a
terminal and how large, and writes that complete (for the console, report/console.py)."""

from __future__ import annotations

import os
from typing import Any

from mbr_launch.fdwait import ready


class Device:
    """One output device behind one or two fds (stdout and stderr on one terminal share it)."""

    def __init__(self, fd: int, tty: bool) -> None:
        self.fd, self.tty = fd, tty
        self.buf = bytearray()
        self.buf_fd = fd
        self.owner: Any = None  # the console.ConsoleSource whose unfinished line the cursor stands after
        self.alive = True
        self.live = False  # a status area is pinned at the bottom
        self.drawn = 0  # rows of the area on the screen now (the cursor is at the start of the row below)
        self.dirty = False  # the area must be redrawn

    def put(self, fd: int, data: bytes) -> None:
        if not self.tty and fd != self.buf_fd:
            self.write_out()  # a file shared by stdout and stderr: keep the order, each through its fd
            self.buf_fd = fd
        self.buf += data

    def write_out(self, extra: bytes = b"") -> None:
        data, self.buf = bytes(self.buf) + extra, bytearray()
        if not self.alive or not data:
            return
        try:
            write_all(self.fd if self.tty else self.buf_fd, data)
        except OSError:
            self.alive = False  # a closed terminal or pipe: keep draining the workers, show nothing more


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:  # someone made the terminal non-blocking: wait until it takes more
            ready([fd], 1.0, write=True)


def size(fd: int) -> tuple[int, int]:
    try:
        cols, rows = os.get_terminal_size(fd)
    except OSError:
        cols, rows = 0, 0
    return cols or 80, rows or 24


def isatty(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False


def same_device(a: int, b: int) -> bool:
    try:
        sa, sb = os.fstat(a), os.fstat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino, sa.st_rdev) == (sb.st_dev, sb.st_ino, sb.st_rdev)
