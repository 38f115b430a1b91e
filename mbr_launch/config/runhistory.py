"""The runs kept in this user's default base folder (``<tmp>/mbr-launch-<uid>``): a ``latest`` link to the
newest, and retention of the last N (``--keep-runs``).

Runs of one user may start and end at once, so a folder is removed only when its name has
``rundir.run_folder_name``'s shape, it is a real folder of ours, nothing in it changed for ``QUIET_AGE``
seconds, and no live launcher holds its ``flock`` (``hold``; the kernel drops it however the agent ends).
The base was checked private before, so nobody else can plant a link for us to follow."""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import stat
import time
import uuid
from pathlib import Path

from mbr_launch.report.runs import LATEST  # the name `mbr-launch report` looks for

# A folder with a change more recent than this may belong to a run that has just made it and not yet locked it.
QUIET_AGE = 300.0
RUN_FOLDER = re.compile(r"^\d{8}-\d{6}_[A-Za-z0-9._-]*_[0-9a-f]{6}_[A-Za-z0-9._-]+$")

_held: list[int] = []  # the open folders whose locks this process holds until it exits


def hold(run_dir: Path) -> None:
    """Lock ``run_dir`` for as long as this process lives, so that no other run's retention removes it."""
    try:
        fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return  # without the lock the folder is still protected by its recent changes for QUIET_AGE
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return
    _held.append(fd)


def in_use(run_dir: Path) -> bool:
    try:
        fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return True  # cannot tell: leave it
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # also lets go of the lock just taken
    return False


def point_latest(base: Path, run_dir: Path) -> None:
    """``<base>/latest`` -> ``run_dir``, replaced atomically (a rename never follows the old link); a ``latest``
    that is no link is left alone."""
    temporary = base / f".{LATEST}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        os.symlink(run_dir.name, temporary)
        current = os.lstat(base / LATEST) if os.path.lexists(base / LATEST) else None
        if current is None or stat.S_ISLNK(current.st_mode):
            os.replace(temporary, base / LATEST)
    except OSError:
        pass  # a convenience: the run goes on without it
    finally:
        try:
            os.unlink(temporary)
        except OSError:
            pass  # renamed: nothing left under the temporary name


def runs(base: Path) -> list[Path]:
    """The run folders of ours in ``base``, oldest first."""
    found = []
    uid = os.geteuid()
    for entry in os.scandir(base):
        if not RUN_FOLDER.match(entry.name):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == uid:
            found.append(Path(entry.path))
    return sorted(found, key=lambda p: p.name)


def prune(base: Path, *, keep: int, now: float | None = None) -> list[Path]:
    """Remove the run folders older than the ``keep`` newest that no run uses (0 keeps all); returns those removed."""
    if keep <= 0:
        return []
    now = time.time() if now is None else now
    removed = []
    try:
        old = runs(base)[:-keep]
    except OSError:
        return []
    for run_dir in old:
        try:
            if now - os.lstat(run_dir).st_mtime < QUIET_AGE or in_use(run_dir):
                continue
        except OSError:
            continue
        shutil.rmtree(run_dir, ignore_errors=True)
        if not os.path.lexists(run_dir):
            removed.append(run_dir)
    return removed
