"""Reading files that someone else on this host could have put in place, and telling where they could.

Dumps and stack files may sit where a neighbour can plant a FIFO, a symlink or a huge file (docs/security.md):
reads go through ``report.untrusted``'s ``OWNED`` policy, and here is how a refusal is worded. ``planting_risk``
lets the preflight refuse a directory where others can create names.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
from typing import Any, Callable, TypeVar

from mbr_launch.report.untrusted import OWNED, FileRule, UnsafeFile, open_file, read_file

_T = TypeVar("_T")

_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symbolic link"))


def open_owned(path: "str | os.PathLike[str]") -> int:
    """A read-only fd on ``path``, a regular file of ours with one link; the caller closes it. Raises
    ``FileNotFoundError`` (no dump yet is no refusal), ``UnsafeFile``, or an ``OSError`` saying "cannot be read"."""
    return _worded(open_file, path, OWNED)


def read_owned(path: "str | os.PathLike[str]", limit: int) -> bytes:
    """The whole of ``path`` (``open_owned``'s rules), refused past ``limit`` bytes."""
    return _worded(read_file, path, OWNED, limit)


def _worded(call: Callable[..., _T], path: "str | os.PathLike[str]", *args: Any) -> _T:
    """``call(path, *args)``, any OSError but a missing file worded to say what the file was."""
    try:
        return call(path, *args)
    except FileNotFoundError:
        raise
    except UnsafeFile as err:
        if err.rule is FileRule.SYMLINK:
            raise err.reworded("is a symbolic link") from None
        if err.rule is FileRule.KIND and err.st is not None:
            kind = next((kind for test, kind in _KINDS if test(err.st.st_mode)), None)
            raise err.reworded(f"is {kind}, not a regular file" if kind else "is not a regular file") from None
        raise
    except OSError as err:
        raise OSError(err.errno, f"cannot be read: {err.strerror or err}", os.fspath(path)) from None


# ---- where others can plant a name ------------------------------------------------------------------------


def planting_risk(directory: "str | os.PathLike[str]", *, uid: int | None = None) -> str | None:
    """Why someone other than us (``uid``) and root could create or replace a name in ``directory``; None
    when nobody else can. The sticky bit does not help (a dump's name is known before it exists); an ancestor
    they own or can write without it lets them replace the directory. POSIX ACLs are not read."""
    uid = os.geteuid() if uid is None else uid
    path = os.path.abspath(os.fspath(directory))
    for link in _symlinks(path):
        owner = os.lstat(link).st_uid
        if owner not in (uid, 0):
            return f"{link} is a symbolic link of uid {owner}, who can point it anywhere"
    real = os.path.realpath(path)
    first = real
    while not os.path.isdir(first):  # a missing directory: whoever can write its parent can make it first
        parent = os.path.dirname(first)
        if parent == first:
            break
        first = parent
    st = os.stat(first)
    where = first if first == real else f"{first} (where the missing {real} would be made)"
    if st.st_uid not in (uid, 0):
        return f"{where} belongs to uid {st.st_uid}"
    if who := _others_write(st, uid):
        sticky = " (the sticky bit keeps our files from being deleted, not new names from being made)" \
            if st.st_mode & stat.S_ISVTX else ""
        return f"{who} can write {where}{sticky}"
    ancestor = os.path.dirname(first)
    while ancestor != first:
        st = os.stat(ancestor)
        if st.st_uid not in (uid, 0):
            return f"{ancestor} belongs to uid {st.st_uid}, who can rename {first} and put another in its place"
        if (who := _others_write(st, uid)) and not st.st_mode & stat.S_ISVTX:
            return f"{who} can write {ancestor} (no sticky bit), so they can rename what is in it"
        first, ancestor = ancestor, os.path.dirname(ancestor)
    return None


def _symlinks(path: str) -> list[str]:
    """The components of ``path`` (absolute, as given) that are symlinks."""
    out, prefix = [], os.sep
    for part in path.strip(os.sep).split(os.sep):
        prefix = os.path.join(prefix, part)
        try:
            if stat.S_ISLNK(os.lstat(prefix).st_mode):
                out.append(prefix)
        except OSError:
            break  # the rest does not exist yet
    return out


def _others_write(st: os.stat_result, uid: int) -> str | None:
    """Who besides ``uid`` may write a directory with this mode: "everyone", "group NAME", or None."""
    if st.st_mode & stat.S_IWOTH:
        return "everyone"
    if st.st_mode & stat.S_IWGRP and not _group_is_only(st.st_gid, uid):
        return f"group {_group_name(st.st_gid)}"
    return None


def _group_is_only(gid: int, uid: int) -> bool:
    """Whether group ``gid`` is ``uid``'s own private group: its primary group, named after it, listing no one
    else (finding others whose primary group it is would need ``getpwall``, slow with LDAP)."""
    try:
        group, user = grp.getgrgid(gid), pwd.getpwuid(uid)
    except KeyError:
        return False
    return gid == user.pw_gid and group.gr_name == user.pw_name and set(group.gr_mem) <= {user.pw_name}


def _group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)
