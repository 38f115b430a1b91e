"""cluster.layout: the round's layout through a real TCPStore, O(1) operations per non-zero rank."""

from __future__ import annotations

import datetime
import threading

from torch.distributed import PrefixStore, TCPStore

from mbr_launch.cluster.layout import agree, decode_sizes, encode_sizes
from mbr_launch.cluster.storevalue import Sealer


def test_sizes_run_length_round_trip():
    for sizes in ([8] * 4096, [1], [2, 2, 4, 1, 1, 2]):
        assert decode_sizes(encode_sizes(sizes), len(sizes)) == sizes
    assert encode_sizes([8] * 4096) == "8x4096"


def test_every_rank_agrees_on_one_layout():
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                      timeout=datetime.timedelta(seconds=10))
    sizes = [2, 1, 2, 2]
    results: dict[int, object] = {}

    def node(rank: int) -> None:
        client = PrefixStore("r0", TCPStore("127.0.0.1", server.port, is_master=False,
                                            timeout=datetime.timedelta(seconds=10)))
        results[rank] = agree(client, rank, len(sizes), sizes[rank], lambda: ("tok", 3, 12345))

    threads = [threading.Thread(target=node, args=(r,)) for r in reversed(range(len(sizes)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert len(results) == len(sizes)
    for rank, lay in results.items():
        assert (lay.token, lay.restarts, lay.master_port, lay.sizes) == ("tok", 3, 12345, sizes)
        assert lay.offset(rank) == sum(sizes[:rank])


def test_the_store_host_waits_for_every_farewell():
    """cluster.stops: the host's wait ends when the last node says farewell (each node on its own connection,
    as each agent is), waits on while farewells keep coming, and gives up when none has come for its quiet
    time (a node that never says it) or after its cap."""
    import time
    from types import SimpleNamespace

    from mbr_launch.cluster.stops import await_farewells, farewell

    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                      timeout=datetime.timedelta(seconds=10))

    def node(prefix: str, size: int = 3) -> SimpleNamespace:
        client = TCPStore("127.0.0.1", server.port, is_master=False, timeout=datetime.timedelta(seconds=10))
        return SimpleNamespace(group_world_size=size, control=PrefixStore(prefix, client), control_prefix=prefix,
                               sealer=Sealer())

    # Every connection is opened before the clock starts: torch's own store server (this one, not on a socket of
    # cluster.listen's) names each new peer with a reverse DNS query for ::ffff:127.0.0.1 in its only thread, and
    # a DNS server that drops it stalls every client of the store for the resolver's 5 s (here: 1 query in 60).
    farewell(node("r1"))
    farewell(node("r1"))
    later, host = threading.Timer(0.3, farewell, args=(node("r1"),)), node("r1")
    later.start()
    t0 = time.monotonic()
    assert await_farewells(host, quiet=5.0, cap=10.0)
    assert time.monotonic() - t0 < 3
    later.join()
    # Farewells that trickle in, each within the quiet time of the one before, are all waited for, past it.
    trickle = [threading.Timer(0.4 * (i + 1), farewell, args=(node("r3", 6),)) for i in range(6)]
    host = node("r3", 6)
    for timer in trickle:
        timer.start()
    t0 = time.monotonic()
    assert await_farewells(host, quiet=0.7, cap=10.0)
    assert 2.2 < time.monotonic() - t0 < 5
    for timer in trickle:
        timer.join()
    farewell(node("r2"))  # one of three: the host gives up when no more come for the quiet time
    host = node("r2")
    t0 = time.monotonic()
    assert not await_farewells(host, quiet=0.5, cap=10.0)
    assert 0.45 < time.monotonic() - t0 < 3
    # ... and after the cap, however they trickle.
    trickle = [threading.Timer(0.2 * (i + 1), farewell, args=(node("r4", 20),)) for i in range(15)]
    host = node("r4", 20)
    for timer in trickle:
        timer.start()
    t0 = time.monotonic()
    assert not await_farewells(host, quiet=1.0, cap=1.0)
    assert 0.95 < time.monotonic() - t0 < 3
    for timer in trickle:
        timer.join()
