"""The rendezvous store made by us for torch's c10d handler: who hosts it, on which socket family, and the
errors a taken port gives. Real TCPStores and torch's own handler."""

from __future__ import annotations

import socket

import psutil
import pytest
from torch.distributed.elastic.rendezvous import RendezvousConnectionError, RendezvousParameters

from mbr_launch.cluster import listen, rdzvstore
from testkit.helpers import free_port

pytestmark = pytest.mark.timeout(60)


def _params(port: int, host: str = "127.0.0.1", nodes: int = 2, **conf: str) -> RendezvousParameters:
    return RendezvousParameters(backend="c10d", endpoint=f"{host}:{port}", run_id=f"t{port}", min_nodes=nodes,
                                max_nodes=nodes, **conf)


def _listening_families(port: int) -> set[int]:
    return {c.family for c in psutil.Process().net_connections("tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port}


def test_an_ipv4_only_name_gets_an_ipv4_socket_and_an_ipv6_name_a_dual_stack_one():
    assert listen.family_for("127.0.0.1") == socket.AF_INET
    assert listen.family_for("::1") == socket.AF_INET6
    assert listen.family_for("no-such-host.invalid") == socket.AF_INET6  # unknown: as torch listens


def test_the_first_agent_hosts_on_ipv4_and_the_second_is_its_client():
    # The host's server sees IPv4 peers as themselves (127.0.0.1: in /etc/hosts), not as ::ffff:127.0.0.1,
    # whose reverse lookup went to the DNS server and stopped the store for 5 s per connection.
    port = free_port()
    host = rdzvstore.make_store(_params(port))
    assert host is not None
    assert _listening_families(port) == {socket.AF_INET}
    client = rdzvstore.make_store(_params(port))  # same machine, port taken: a client, as under torchrun
    assert client is not None
    client.set("k", "v")
    assert host.get("k") == b"v"


def test_torchs_handler_runs_a_round_over_our_store():
    port = free_port()
    handler, patch = rdzvstore.create_handler(_params(port, nodes=1, join_timeout="20"))
    assert handler is not None and type(handler).__name__ == "DynamicRendezvousHandler"
    assert patch.name == "store_socket" and patch.installed, patch
    info = handler.next_rendezvous()
    assert info.rank == 0 and info.world_size == 1
    handler.shutdown()


def test_is_host_on_a_taken_port_is_one_clear_error():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other:
        other.bind(("0.0.0.0", 0))
        other.listen(1)
        port = other.getsockname()[1]
        with pytest.raises(RendezvousConnectionError, match="port .* is taken"):
            rdzvstore.make_store(_params(port, is_host="true"))


def test_a_file_store_is_left_to_torchs_registry():
    handler, patch = rdzvstore.create_handler(_params(free_port(), store_type="file"))
    assert handler is None and not patch.installed and "store_type" in patch.why_not


@pytest.mark.processes
def test_hosts_store_sees_only_this_processs_own_listener():
    """hosts_store reads the kernel's socket tables: our listening store on either family is ours; a client
    connection to it, another process's listener and a closed socket are not."""
    import subprocess
    import sys

    from mbr_launch.cluster.listen import listens_here as hosts_store

    for family, address in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        port = free_port()
        with socket.socket(family) as server:
            server.bind((address, port))
            assert not hosts_store(port)  # bound, not listening
            server.listen()
            assert hosts_store(port)
            with socket.create_connection((address, port)):
                assert hosts_store(port) and not hosts_store(free_port())
        assert not hosts_store(port)
    port = free_port()
    other = subprocess.Popen([sys.executable, "-c", "import socket, sys, time; s = socket.socket(); "
                              f"s.bind(('127.0.0.1', {port})); s.listen(); print('up', flush=True); time.sleep(60)"],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline().strip() == "up"
        assert not hosts_store(port)
    finally:
        other.kill()
        other.wait()
