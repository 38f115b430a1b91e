"""The agent-served worker store: listening before torch's server exists, made off the agent's thread,
reachable the ways ranks reach it, and gone with its port and descriptor once dropped. Real TCPStores."""

from __future__ import annotations

import datetime
import gc
import os
import socket

import psutil
import pytest
from torch.distributed import TCPStore

from mbr_launch.cluster import listen, workerstore
from testkit.helpers import free_port

pytestmark = pytest.mark.timeout(60)


def _client(host: str, port: int) -> TCPStore:
    return TCPStore(host, port, is_master=False, wait_for_workers=False, timeout=datetime.timedelta(seconds=5))


def test_the_socket_accepts_connections_before_anyone_accepts_them():
    # What the store's own client needs inside torch's constructor: the kernel completes the connection
    # from the backlog, whether or not the server thread has started.
    # A master address with IPv6 gets a dual-stack socket: both families connect.
    port = free_port()
    fd = listen.listening_fd(port, "::1")
    assert fd is not None
    try:
        for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
            with socket.socket(family, socket.SOCK_STREAM) as conn:
                conn.settimeout(2)
                conn.connect((host, port))
    finally:
        os.close(fd)


def test_served_store_is_reachable_and_releases_port_and_descriptor():
    warm_up = workerstore.serve("localhost", free_port())  # torch keeps 2 descriptors after its first store
    assert warm_up is not None and warm_up.ready(30)
    del warm_up
    gc.collect()
    port = free_port()
    fds = len(os.listdir("/proc/self/fd"))
    served = workerstore.serve("::1", port)  # dual-stack: reachable both ways
    assert served is not None
    for host in ("localhost", "127.0.0.1", "::1"):  # before the store is made too: the kernel queues them
        client = _client(host, port)
        client.set(f"key-{host}", "v")
        assert served.ready(30) and served.store.get(f"key-{host}") == b"v"
        del client
    del served
    gc.collect()
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as again:  # the port is free for the next round
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(("::", port))
    assert len(os.listdir("/proc/self/fd")) == fds


def test_an_ipv4_master_address_is_served_on_ipv4():
    # Ranks appear to the store's server thread as 127.0.0.1 (in /etc/hosts), not ::ffff:127.0.0.1 (a DNS
    # query each, in the thread that serves every rank: ``cluster.listen``).
    port = free_port()
    served = workerstore.serve("127.0.0.1", port)
    assert served is not None and served.ready(30)
    client = _client("127.0.0.1", port)
    client.set("k", "v")
    assert served.store.get("k") == b"v"
    peers = [c for c in psutil.Process().net_connections("tcp")
             if c.status == psutil.CONN_ESTABLISHED and c.laddr.port == port]
    assert peers and all(c.family == socket.AF_INET and c.raddr.ip == "127.0.0.1" for c in peers)


def test_a_port_held_by_another_listener_gives_none():
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as other:
        other.bind(("::", 0))
        other.listen(1)
        port = other.getsockname()[1]
        fds = len(os.listdir("/proc/self/fd"))
        assert workerstore.serve("localhost", port) is None
        assert len(os.listdir("/proc/self/fd")) == fds
