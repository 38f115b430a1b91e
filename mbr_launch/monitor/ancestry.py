"""Who is on the other end of a connection: the kernel's word (``SO_PEERCRED``), and whether that process
belongs to a worker's process tree.

The sockets are private to the user, but any process of the user can connect. A client's claims (the pid in
its InitMsg) prove nothing, so the monitor serves only processes the kernel says are a worker or one of its
descendants. The tree is walked upwards through ``/proc/<pid>/stat`` (``mbr_launch.procstat``; no psutil: the
monitor must start in milliseconds).
"""

from __future__ import annotations

import socket
import struct
from typing import Collection, Optional

from mbr_launch import procstat

_PEERCRED = struct.Struct("3i")  # pid, uid, gid
MAX_HOPS = 64  # deeper process trees than this are not a worker's


def peer_of(sock: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process that connected; pid 0 when it lives in another pid namespace."""
    pid, uid, _gid = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
    return pid, uid


def parent_of(pid: int) -> Optional[int]:
    """``pid``'s parent; None when it is gone or its stat cannot be read."""
    stat = procstat.read(pid)
    return None if stat is None else stat.ppid


def descends_from(pid: int, roots: Collection[int]) -> bool:
    """``pid`` is one of ``roots`` or a descendant of one."""
    for _ in range(MAX_HOPS):
        if pid in roots:
            return True
        if pid <= 1:
            return False
        parent = parent_of(pid)
        if parent is None:
            return False
        pid = parent
    return False
