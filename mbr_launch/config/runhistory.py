"""The runs kept in this user's default base folder (``<tmp>/mbr-launch-<uid>``): a ``latest`` link to the
newest, and retention of the last N (``--keep-runs``).

Several runs of one user may start and end at once on one host, so a run folder is removed only when all of
these hold: its name has the shape ``rundir.run_folder_name`` gives (nothing else in the base is touched, not
even run folders of older versions), it is a real folder of ours (not a link), nothing in it changed for
``QUIET_AGE`` seconds, and no live launcher holds it: each run holds an ``flock`` on its own folder for the
life of its agent (``hold``), which the kernel lets go of however the agent ends, SIGKILL included. The base
itself has been checked private (ours, 0700) before any of this runs, so no other user can plant a link or a
folder for us to follow or remove; ``shutil.rmtree`` does not follow links inside a folder either.
"""

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
    """Some live launcher holds ``run_dir`` (see ``hold``)."""
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
    """``<base>/latest`` -> ``run_dir`` (relative), replaced atomically: a new link under a temporary name,
    renamed over the old one (a rename replaces the link itself and never follows it). A ``latest`` that is
    no link (a folder someone made) is left alone."""
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
    """The run folders of ours in ``base``, oldest first (the name starts with the start time)."""
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
    """Remove the run folders of ``base`` older than the ``keep`` newest that no run uses; 0 keeps all.
    Returns the folders removed."""
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
