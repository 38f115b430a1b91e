"""The job's rendezvous secret (``--rdzv-secret-file``): read and checked here, used by ``cluster.storevalue``.

Only the path lives in the (recorded) launch configuration; the bytes are read at build time, to refuse a bad
file before anything starts, and again when the agent starts."""

from __future__ import annotations

import os
import stat

from mbr_launch.report.untrusted import SECRET, FileRule, UnsafeFile, open_file, read_at

MIN_SECRET = 16  # bytes: a shorter secret can be guessed offline from one sealed value
MAX_SECRET = 4096


class SecretFileError(ValueError):
    """Why a secret file cannot be used; the message says what to do."""


def read_secret(path: str) -> bytes:
    """The secret in ``path``, surrounding whitespace dropped; ``SecretFileError`` unless it is a regular file of
    this user that others cannot read or write, long enough to resist guessing."""
    try:
        fd = open_file(path, SECRET)  # no link followed, no FIFO waited on, a regular file of ours, mode 600
    except OSError as err:
        raise _unusable(path, err) from None
    try:
        data = read_at(fd, 0, MAX_SECRET + 1).strip()
    finally:
        os.close(fd)
    if len(data) > MAX_SECRET:
        raise SecretFileError(f"{path} is over {MAX_SECRET} bytes; a secret is a short random string")
    if len(data) < MIN_SECRET:
        raise SecretFileError(f"{path} holds {len(data)} bytes; a secret needs at least {MIN_SECRET}: "
                              f"head -c 32 /dev/urandom | base64 > {path} && chmod 600 {path}")
    return data


def _unusable(path: str, err: OSError) -> SecretFileError:
    rule, st = (err.rule, err.st) if isinstance(err, UnsafeFile) else (None, None)
    if rule is FileRule.OWNER and st is not None:
        return SecretFileError(f"{path} belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()})")
    if rule is FileRule.MODE and st is not None:
        return SecretFileError(f"{path} can be read or written by others (mode {stat.S_IMODE(st.st_mode):o}); "
                               f"run: chmod 600 {path}")
    return SecretFileError(f"cannot open {path}: {err.strerror} (a symbolic link is refused too)")
