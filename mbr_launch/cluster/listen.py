"""Listening sockets for the stores this launcher serves (the rendezvous store, the workers' store).

Why not torch's: its dual-stack socket shows IPv4 peers as ``::ffff:a.b.c.d``, which /etc/hosts never
answers, and its one server thread reverse-resolves each peer, so a slow DNS server stalls the whole store.
Where the host name resolves to IPv4 only, we listen on plain IPv4; otherwise dual-stack, as torch does.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import socket


@functools.lru_cache(maxsize=16)  # group rank 0 asks again for every round's worker store, on the restart's path
def family_for(host: str) -> socket.AddressFamily:
    """IPv4 when every address ``host`` has here is IPv4, else IPv6 with IPv4 mapped (as torch listens)."""
    try:
        infos = socket.getaddrinfo(host or "localhost", None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return socket.AF_INET6
    families = {info[0] for info in infos}
    return socket.AF_INET if families == {socket.AF_INET} else socket.AF_INET6


@functools.lru_cache(maxsize=16)  # asked for every round's worker store, on the restart's path: one lookup
def is_loopback(host: str) -> bool:
    """Whether every address ``host`` has here is an IPv4 loopback one (with ::1 among them its clients may
    come over IPv6, and one socket cannot listen on both loopbacks)."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return False
    return bool(infos) and all(info[0] == socket.AF_INET and ipaddress.ip_address(info[4][0]).is_loopback
                               for info in infos)


def listening_fd(port: int, host: str, *, loopback: bool = False) -> int | None:
    """A descriptor listening on ``port`` for torch's ``master_listen_fd`` (the store then owns it); None when
    the port is taken. ``loopback``: on 127.0.0.1 only (a single-node job)."""
    if loopback:
        return _bound(socket.AF_INET, "127.0.0.1", port)
    order = [socket.AF_INET] if family_for(host) == socket.AF_INET else [socket.AF_INET6, socket.AF_INET]
    for family in order:
        fd = _bound(family, "::" if family == socket.AF_INET6 else "0.0.0.0", port)
        if fd is not None:
            return fd
    return None


def _bound(family: socket.AddressFamily, address: str, port: int) -> int | None:
    try:
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError:
        return None  # no IPv6 on this machine
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT of a past round is fine
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind((address, port))
        sock.listen(socket.SOMAXCONN)
        sock.set_inheritable(False)
        return sock.detach()
    except OSError:
        sock.close()  # taken (then IPv4 fails too) or no IPv6 on this machine
        return None


def close_fd(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def listening_inodes(port: int) -> set[str]:
    """The TCP sockets listening on ``port`` here, as ``socket:[inode]``, from /proc/net/tcp{,6} (psutil
    parses every socket of the host: too costly)."""
    wanted = f":{port:04X}"
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f, None)  # the header
                for line in f:
                    fields = line.split()
                    # local address "ADDR:PORT" (hex), state 0A = LISTEN, inode
                    if len(fields) > 9 and fields[3] == "0A" and fields[1].endswith(wanted):
                        inodes.add(f"socket:[{fields[9]}]")
        except OSError:
            continue
    return inodes


def holds(pid: int | str, inodes: set[str]) -> bool:
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                return True
        except OSError:
            continue  # closed meanwhile (the listdir's own descriptor among them)
    return False


def listens_here(port: int) -> bool:
    inodes = listening_inodes(port)
    return bool(inodes) and holds("self", inodes)
