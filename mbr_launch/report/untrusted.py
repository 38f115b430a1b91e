"""Opening a file someone else may have planted: only a regular file, never through a symlink a caller does not
accept, never blocked on by a FIFO, and only as the caller's ``FilePolicy`` allows (ours, one link, private).

Each file is looked at with ``lstat`` before the open (a device is never opened: that can act), opened with
``O_NOFOLLOW | O_NONBLOCK | O_NOCTTY``, checked again with ``fstat`` (the name may have been swapped), and read
no further than the caller's bound plus one byte. A refusal is an ``UnsafeFile`` (an ``OSError``).
"""

from __future__ import annotations

import enum
import errno
import os
import stat
from dataclasses import dataclass


@dataclass(frozen=True)
class FilePolicy:
    """What a caller demands of a file beyond its being a regular file (which every policy demands)."""

    follow: bool = False  # a symlink is followed (a config file the user linked), not refused
    ours: bool = False  # owned by this process's effective uid
    one_link: bool = False  # one name: a hard link could make us read (or write) a file of ours we did not mean
    private: bool = False  # no permission bit for group or others (a secret others can read protects nothing)


REGULAR = FilePolicy()  # a regular file, reached without a symlink at its last component
LINKED = FilePolicy(follow=True)  # a file a person named: a link to it is fine, a FIFO or a device is not
OWNED = FilePolicy(ours=True, one_link=True)  # a file one of ours wrote (a dump, a stack file, a log of ours)
SECRET = FilePolicy(ours=True, private=True)  # a secret of this user's, which nobody else can read or write


class FileRule(enum.Enum):
    SYMLINK = "symlink"  # the open met a symlink (O_NOFOLLOW); a symlink seen before the open is a KIND
    KIND = "kind"  # not a regular file: a FIFO, a device, a socket, a folder, a symlink
    OWNER = "owner"
    LINKS = "links"
    MODE = "mode"
    SIZE = "size"  # larger than the bound before reading
    GREW = "grew"  # grew past the bound while read


class UnsafeFile(OSError):
    """A file refused by a ``FilePolicy`` or a size bound; ``st`` (when known) is what the file was."""

    def __init__(self, rule: FileRule, path: "str | os.PathLike[str]", *, st: os.stat_result | None = None,
                 limit: int = 0, reason: str | None = None) -> None:
        code = {FileRule.SYMLINK: errno.ELOOP, FileRule.KIND: errno.EINVAL, FileRule.SIZE: errno.EFBIG,
                FileRule.GREW: errno.EFBIG}.get(rule, errno.EPERM)
        super().__init__(code, reason or _default_reason(rule, st, limit), os.fspath(path))
        self.rule, self.st, self.limit = rule, st, limit

    def reworded(self, reason: str) -> UnsafeFile:
        return UnsafeFile(self.rule, self.filename, st=self.st, limit=self.limit, reason=reason)


def _default_reason(rule: FileRule, st: os.stat_result | None, limit: int) -> str:
    if rule is FileRule.GREW:
        return f"grew past the {limit} bytes we read"
    if st is None or stat.S_ISLNK(st.st_mode):  # SYMLINK (no stat: the open met it), or a KIND that is a link
        return "is a symlink (not followed)"
    if rule is FileRule.KIND:
        return "is not a regular file (a FIFO, a device, a socket or a folder)"
    if rule is FileRule.OWNER:
        return f"belongs to uid {st.st_uid}, not to us (uid {os.geteuid()})"
    if rule is FileRule.LINKS:
        return f"has {st.st_nlink} hard links (a file we write has one)"
    if rule is FileRule.MODE:
        return f"can be read or written by others (mode {stat.S_IMODE(st.st_mode):o})"
    return f"is {st.st_size} bytes, more than the {limit} we read"


def check(st: os.stat_result, policy: FilePolicy, path: "str | os.PathLike[str]") -> None:
    """Raise ``UnsafeFile`` unless ``st`` is a regular file as ``policy`` wants it."""
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeFile(FileRule.KIND, path, st=st)
    if policy.ours and st.st_uid != os.geteuid():
        raise UnsafeFile(FileRule.OWNER, path, st=st)
    if policy.one_link and st.st_nlink > 1:
        raise UnsafeFile(FileRule.LINKS, path, st=st)
    if policy.private and st.st_mode & 0o077:
        raise UnsafeFile(FileRule.MODE, path, st=st)


def open_file(path: "str | os.PathLike[str]", policy: FilePolicy = REGULAR) -> int:
    """A read-only fd on ``path`` if it passes ``policy``; the caller closes it. Never blocks."""
    check((os.stat if policy.follow else os.lstat)(path), policy, path)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC | (0 if policy.follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as err:
        # O_NOFOLLOW's answer for a symlink swapped in since the look: ELOOP (EMLINK on some BSDs)
        if not policy.follow and err.errno in (errno.ELOOP, errno.EMLINK):
            raise UnsafeFile(FileRule.SYMLINK, path) from None
        raise
    try:
        check(os.fstat(fd), policy, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_at(fd: int, offset: int, limit: int) -> bytes:
    chunks, size = [], 0
    while size < limit:
        chunk = os.pread(fd, min(limit - size, 1 << 20), offset + size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def read_file(path: "str | os.PathLike[str]", policy: FilePolicy, limit: int) -> bytes:
    """The whole of ``path``, refused (SIZE or GREW) beyond ``limit`` bytes; memory holds at most ``limit + 1``."""
    fd = open_file(path, policy)
    try:
        st = os.fstat(fd)
        if st.st_size > limit:
            raise UnsafeFile(FileRule.SIZE, path, st=st, limit=limit)
        data = read_at(fd, 0, limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise UnsafeFile(FileRule.GREW, path, limit=limit)
    return data
