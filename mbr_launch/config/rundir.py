"""Where one run's files go: its run folder (under ``--log-dir``, else a private base folder of this user's)
and the folder of the rank monitor's sockets. Each failure is a ``ConfigError`` (exit 2) that says what
to do; why the default base is checked so closely: docs/security.md, "Log folders".

In the default base, ``latest`` links to the newest run and only the last ``--keep-runs`` are kept. Runs of one
user may start and end at once, so a folder is removed only when its name has ``run_folder_name``'s shape, it
is a real folder of ours, nothing in it changed for ``QUIET_AGE`` seconds, and no live launcher holds its
``flock`` (``hold``; the kernel drops it however the agent ends)."""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import stat
import tempfile
import time
import uuid
from pathlib import Path

from mbr_launch.config.errors import ConfigError
from mbr_launch.report.runs import LATEST  # the name `mbr-launch report` looks for

DIR_MODE = 0o700
SOCKET_PATH_MAX = 107  # sun_path holds 108 bytes, the last one the terminating NUL
_SOCKET_DIR_PREFIX = "mbr-"
_MKDTEMP_RANDOM = 8  # characters tempfile.mkdtemp adds after the prefix
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def safe_component(text: str, limit: int = 80) -> str:
    """``text`` (an id we do not control) as one harmless path component of at most ``limit`` characters."""
    cleaned = _UNSAFE.sub("_", text)[:limit]
    if cleaned.startswith("."):
        cleaned = "_" + cleaned[1:]  # never "." or "..", never hidden
    return cleaned or "_"


def default_base(tmp: str | None = None) -> Path:
    return Path(tmp or tempfile.gettempdir()) / f"mbr-launch-{os.geteuid()}"


def private_base(path: Path) -> Path:
    """Create ``path`` (0700) or check the one that is there: a real folder, ours, writable by us alone."""
    try:
        os.mkdir(path, DIR_MODE)
    except FileExistsError:
        pass
    except OSError as exc:
        raise ConfigError(f"cannot create the log folder {path}: {exc.strerror}; pass --log-dir DIR") from None
    st = os.lstat(path)
    what = ("another user may have made it to read or redirect your logs; remove it (or have its owner "
            "remove it), or pass --log-dir DIR")
    if stat.S_ISLNK(st.st_mode):
        raise ConfigError(f"the log folder {path} is a symlink, not a folder: {what}")
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"the log folder {path} is not a folder: remove it, or pass --log-dir DIR")
    if st.st_uid != os.geteuid():
        raise ConfigError(f"the log folder {path} belongs to uid {st.st_uid}, not to you: {what}")
    if st.st_mode & 0o022:
        raise ConfigError(f"the log folder {path} is writable by others (mode {st.st_mode & 0o777:o}): {what}")
    if st.st_mode & 0o077:
        os.chmod(path, DIR_MODE)  # ours and safe, but readable by others: close it
    return path


def checked_log_dir(path: Path) -> Path:
    """``--log-dir`` (created if missing): the user's folder, maybe shared with their team, but not one where anybody
    can replace our run folder (writable by all, without the sticky bit)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        st = os.stat(path)
    except OSError as exc:
        raise ConfigError(f"--log-dir: cannot create {path}: {exc.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"--log-dir: {path} is not a folder")
    if st.st_mode & 0o002 and not st.st_mode & stat.S_ISVTX:
        raise ConfigError(f"--log-dir: {path} is writable by everyone without the sticky bit, so any user "
                          "could replace your run folder; use a folder of yours, or `chmod o-w` (or +t) it")
    return path


def run_folder_name(run_id: str, node: str, *, now: float | None = None) -> str:
    """``<start time>_<run id>_<6 hex>_<node>``: sorted by name is sorted by start; the random part keeps two agents
    of one host that share a log folder apart."""
    started = time.strftime("%Y%m%d-%H%M%S", time.localtime(time.time() if now is None else now))
    return f"{started}_{safe_component(run_id)}_{uuid.uuid4().hex[:6]}_{safe_component(node)}"


def make_run_dir(log_dir: str | None, run_id: str, node: str, *, keep_runs: int = 0,
                 now: float | None = None) -> Path:
    """A fresh run folder (0700) for this node, inside the base folder. Under the default base the run also holds it,
    points ``<base>/latest`` at it and prunes old runs; a ``--log-dir`` gets the run folder only."""
    base = checked_log_dir(Path(log_dir)) if log_dir else private_base(default_base())
    run_dir = base / run_folder_name(run_id, node, now=now)
    try:
        os.mkdir(run_dir, DIR_MODE)  # fresh: a folder already there (planted or not) is never reused
        os.chmod(run_dir, DIR_MODE)  # whatever the umask
    except OSError as exc:
        raise ConfigError(f"cannot create the run folder {run_dir}: {exc.strerror}") from None
    if not log_dir:
        hold(run_dir)
        point_latest(base, run_dir)
        prune(base, keep=keep_runs, now=now)
    return run_dir


def make_socket_dir(longest_name: str) -> Path:
    """A private folder (0700) for the rank monitor's sockets, in the temp dir, or in /tmp when ``TMPDIR`` is too
    long for a socket address."""
    tmp = tempfile.gettempdir()
    tried = []
    for parent in dict.fromkeys((tmp, "/tmp")):
        longest = os.path.join(parent, _SOCKET_DIR_PREFIX + "x" * _MKDTEMP_RANDOM, longest_name)
        if len(os.fsencode(longest)) > SOCKET_PATH_MAX:
            tried.append(f"{parent}: a socket path would be {len(os.fsencode(longest))} bytes")
            continue
        try:
            return Path(tempfile.mkdtemp(prefix=_SOCKET_DIR_PREFIX, dir=parent))
        except OSError as exc:
            tried.append(f"{parent}: {exc.strerror}")
    raise ConfigError(f"no folder for the rank monitor's sockets (a socket path may have at most "
                      f"{SOCKET_PATH_MAX} bytes): {'; '.join(tried)}; set TMPDIR to a short, writable folder")


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
