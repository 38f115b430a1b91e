"""Listening sockets for the stores this launcher serves (the rendezvous store, the workers' store).

torch's own store server listens on an IPv6 socket with IPv4 mapped into it, so an IPv4 client appears to it
as ``::ffff:a.b.c.d``; torch names every accepted peer with a reverse DNS lookup (``formatSockAddr``, done
in the store's one server thread whatever the log level), and a mapped address never matches /etc/hosts,
so every accepted connection asks the DNS server. Where that server is slow the whole store stops
answering: 5 s per connection on this project's 2-core sandbox during a burst of 32 agents (strace: the
server thread's PTR query for each accepted ``::ffff:127.0.0.1``), which is what made every agent of a
``--standby off`` 32-agent run give the store up as lost. When the store's host name resolves to IPv4
addresses only, every client reaches it over IPv4 anyway, so the socket here is a plain IPv4 one: peers then
appear as ``a.b.c.d``, which /etc/hosts answers at once (``127.0.0.1`` always; cluster nodes where
/etc/hosts lists them). A name with any IPv6 address keeps torch's dual-stack socket.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import socket


@functools.lru_cache(maxsize=16)  # group rank 0 asks again for every round's worker store, on the restart's path
def family_for(host: str) -> socket.AddressFamily:
    """The family to listen with for clients that connect to ``host``: IPv4 when every address the name has
    here is IPv4, else IPv6 with IPv4 mapped (as torch listens). An unresolvable name: dual-stack."""
    try:
        infos = socket.getaddrinfo(host or "localhost", None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return socket.AF_INET6
    families = {info[0] for info in infos}
    return socket.AF_INET if families == {socket.AF_INET} else socket.AF_INET6


@functools.lru_cache(maxsize=16)  # asked for every round's worker store, on the restart's path: one lookup
def is_loopback(host: str) -> bool:
    """Whether every address ``host`` has here is an IPv4 loopback one (``localhost`` on most machines,
    127.0.0.1): a store for it can listen on 127.0.0.1 alone. A name with ::1 among its addresses is not: its
    clients may come over IPv6, and one socket cannot listen on both loopbacks."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return False
    return bool(infos) and all(info[0] == socket.AF_INET and ipaddress.ip_address(info[4][0]).is_loopback
                               for info in infos)


def listening_fd(port: int, host: str, *, loopback: bool = False) -> int | None:
    """A socket listening on ``port`` on every local address of ``family_for(host)`` (falling back to IPv4
    where the machine has no IPv6), handed over as a bare descriptor for torch's ``master_listen_fd``: the
    store owns and closes it from then on. None when the port cannot be bound (someone else listens).
    ``loopback``: on 127.0.0.1 only (a single-node job: no other machine has any business with its store)."""
    if loopback:
        return _bound(socket.AF_INET, "127.0.0.1", port)
    order = [socket.AF_INET] if family_for(host) == socket.AF_INET else [socket.AF_INET6, socket.AF_INET]
    for family in order:
        fd = _bound(family, "::" if family == socket.AF_INET6 else "0.0.0.0", port)
        if fd is not None:
            return fd
    return None


def _bound(family: socket.AddressFamily, address: str, port: int) -> int | None:
    """A listening socket of ``family`` bound to ``address``, as a bare descriptor; None when it cannot be."""
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
    """Close a ``listening_fd`` descriptor that no store took over (the store closes the ones it owns)."""
    try:
        os.close(fd)
    except OSError:
        pass


def listening_inodes(port: int) -> set[str]:
    """The TCP sockets listening on ``port`` (any address) on this machine, as a descriptor's link names them
    (``socket:[inode]``), from the kernel's socket tables (/proc/net/tcp, tcp6). Read directly: psutil's
    per-process connection list parses every socket of the host into objects, which took an agent ~4% of its
    CPU at the end of a 32-agent run on 2 cores."""
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
    """Whether process ``pid`` ("self": this one) has one of ``inodes`` open (False where /proc does not tell)."""
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
    """Whether this process holds a TCP socket listening on ``port`` (any address)."""
    inodes = listening_inodes(port)
    return bool(inodes) and holds("self", inodes)
