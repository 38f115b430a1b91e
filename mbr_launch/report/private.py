"""Files and folders only their owner can read (0700, 0600), created without following a symlink someone
planted: worker output and events can hold secrets, and nobody may redirect our appends to a file of theirs.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from mbr_launch.report.untrusted import OWNED, UnsafeFile, check

DIR_MODE = 0o700
FILE_MODE = 0o600


def make_dir(path: Path) -> None:
    """Create ``path`` (0700, its parent must exist) unless it is there; refuse a symlink or another's folder."""
    try:
        os.mkdir(path, DIR_MODE)
    except FileExistsError:
        pass
    check_dir(path)


def check_dir(path: Path) -> None:
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise OSError(errno.ELOOP, "is a symlink, not a folder", str(path))
    if not stat.S_ISDIR(st.st_mode):
        raise OSError(errno.ENOTDIR, "is not a folder", str(path))
    if st.st_uid != os.geteuid():
        raise OSError(errno.EPERM, f"belongs to uid {st.st_uid}, not to us (uid {os.geteuid()})", str(path))


def open_private(path: Path, *, append: bool = True, fresh: bool = False) -> int:
    """A write-only fd on ``path`` (created 0600, ``fresh``: ``O_EXCL``), never through a symlink; a hard link
    or a FIFO planted there is refused before anything is written or truncated."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    flags |= os.O_EXCL if fresh else os.O_APPEND if append else 0
    fd = os.open(path, flags, FILE_MODE)
    try:
        try:
            check(os.fstat(fd), OWNED, path)
        except UnsafeFile:
            raise OSError(errno.EPERM, "is not a regular file of ours", str(path)) from None
        os.set_blocking(fd, True)
        if not append and not fresh:
            os.ftruncate(fd, 0)  # only now that it is known to be ours (O_TRUNC would cut first)
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_private(path: Path, data: bytes) -> None:
    fd = open_private(path, append=False)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
