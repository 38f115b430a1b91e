"""Who is on the other end of a connection: the kernel's word (``SO_PEERCRED``), and whether that process
belongs to a worker's process tree.

The sockets are private to the user, but any process of the user can connect. A client's claims (the pid in
its InitMsg) prove nothing, so the monitor serves only processes the kernel says are a worker or one of its
descendants. The tree is walked upwards through ``/proc/<pid>/stat`` (no psutil: the monitor must start in
milliseconds).
"""

from __future__ import annotations

import socket
import struct
from typing import Collection, Optional

_PEERCRED = struct.Struct("3i")  # pid, uid, gid
MAX_HOPS = 64  # deeper process trees than this are not a worker's


def peer_of(sock: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process that connected; pid 0 when it lives in another pid namespace."""
    pid, uid, _gid = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
    return pid, uid


def parent_of(pid: int) -> Optional[int]:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read()
    except OSError:
        return None
    # The command name is in parentheses and may contain anything: the fields start after the last ")".
    fields = text.rsplit(b")", 1)[-1].split()
    try:
        return int(fields[1])
    except (IndexError, ValueError):
        return None


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
