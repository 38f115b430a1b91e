"""Files and folders only their owner can read, created without following a symlink someone planted.

Run folders and everything in them are ours alone (0700 folders, 0600 files): worker output and events
can hold secrets, and another user must not be able to read them, nor swap a folder or a file for a
symlink and have us append to a file of their choice. Every file is opened with ``O_NOFOLLOW`` and checked
to be a regular file of ours (``untrusted.check``, the rules of reading such files); every folder we use is
checked to be a real folder of ours, not a symlink.
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
    """Create ``path`` (0700) unless it is already there; refuse a symlink or a folder of someone else's.

    Only the last component is created: its parent must exist (callers create folders top down)."""
    try:
        os.mkdir(path, DIR_MODE)
    except FileExistsError:
        pass
    check_dir(path)


def check_dir(path: Path) -> None:
    """Raise OSError unless ``path`` is a real folder (not a symlink) owned by us."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise OSError(errno.ELOOP, "is a symlink, not a folder", str(path))
    if not stat.S_ISDIR(st.st_mode):
        raise OSError(errno.ENOTDIR, "is not a folder", str(path))
    if st.st_uid != os.geteuid():
        raise OSError(errno.EPERM, f"belongs to uid {st.st_uid}, not to us (uid {os.geteuid()})", str(path))


def open_private(path: Path, *, append: bool = True, fresh: bool = False) -> int:
    """A write-only fd on ``path`` (created 0600), never through a symlink; ``fresh``: the file must not
    exist yet (``O_EXCL``), otherwise an existing file is appended to (``append``) or truncated.

    The opened file must be a regular file owned by us: a hard link or a FIFO planted in its place is
    refused before anything is written or truncated (the open never blocks: ``O_NONBLOCK`` until checked)."""
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
    """Write ``data`` as the whole content of ``path`` (0600, no symlink followed)."""
    fd = open_private(path, append=False)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
