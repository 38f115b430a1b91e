"""Watcher connections kept from one round to the next (cluster.storeclients), against a real TCPStore: a
round's watchers give theirs back when they stop cleanly, the next round's take them instead of opening new
ones, and a connection whose store went away is not handed out again."""

from __future__ import annotations

import datetime
import time

import pytest
from torch.distributed import PrefixStore, TCPStore

from mbr_launch.cluster import storeclients
from mbr_launch.cluster.storeclients import ClientPool
from mbr_launch.cluster.peers import PeerWatch
from mbr_launch.cluster.stops import STOP_KEY, StopListener

from testkit.helpers import free_port
from .test_peers import _Round  # the fields the watchers read, and Round's own connect_control

pytestmark = pytest.mark.timeout(60)


def _host(port: int) -> TCPStore:
    return TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                    timeout=datetime.timedelta(seconds=10))


def _until(condition, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


# How long a new connection may take: torch's store client looks up the name of the address it connected to,
# and where DNS drops a query (this sandbox's: about one in 25) that lookup holds the connect for 5 s.
CONNECT = 30


def test_the_pool_hands_back_what_was_released_and_keeps_a_bounded_number():
    port = free_port()
    host = _host(port)
    pool = ClientPool()
    first = pool.acquire("127.0.0.1", port, timeout=CONNECT)
    pool.release(first)
    assert pool.acquire("127.0.0.1", port, timeout=CONNECT) is first and pool.idle("127.0.0.1", port) == 0
    clients = [pool.acquire("127.0.0.1", port, timeout=CONNECT) for _ in range(storeclients.KEEP + 2)]
    for client in clients:
        pool.release(client)
    assert pool.idle("127.0.0.1", port) == storeclients.KEEP
    del host


def test_the_next_rounds_watchers_reuse_the_connections_and_a_dead_stores_are_dropped(monkeypatch):
    pool = ClientPool()
    monkeypatch.setattr(storeclients, "POOL", pool)
    port = free_port()
    hosts = [_host(port)]  # a list, so that the store can be dropped while the helper below refers to it
    rnd = _Round(store_port=port)
    seen: list[bytes] = []

    def one_round(key_value: bool) -> tuple[StopListener, PeerWatch]:
        stop = StopListener(rnd, seen.append)  # type: ignore[arg-type]
        peers = PeerWatch(rnd, timeout=5.0, on_lost=lambda _silence: None)  # type: ignore[arg-type]
        stop.start()
        peers.start()
        if key_value:  # a peer's stop message ends the stop listener with its value
            PrefixStore(rnd.control_prefix, hosts[0]).set(STOP_KEY, "bye")
            _until(lambda: seen == [b"bye"])
        time.sleep(0.3)
        stop.cancel()
        peers.cancel()
        stop.join(5)
        peers.join(5)
        return stop, peers

    one_round(key_value=False)
    assert pool.idle("127.0.0.1", port) == 2  # both watchers gave their connection back
    kept = list(pool._idle[("127.0.0.1", port)])
    one_round(key_value=True)
    assert sorted(map(id, pool._idle[("127.0.0.1", port)])) == sorted(map(id, kept))  # the same two, no new one
    hosts.clear()  # the store goes away: a watcher that meets it broken does not give its connection back
    one_round(key_value=False)
    assert pool.idle("127.0.0.1", port) == 0


def test_prefill_opens_the_first_rounds_connections_ahead_and_gives_up_quietly_without_a_store():
    port = free_port()
    host = _host(port)
    pool = ClientPool()
    pool.prefill("127.0.0.1", port, 3).join(30)
    assert pool.idle("127.0.0.1", port) == 3
    taken = pool.acquire("127.0.0.1", port, timeout=5)  # one of those, already connected
    assert pool.idle("127.0.0.1", port) == 2
    taken.set("k", "v")
    assert host.get("k") == b"v"
    nobody = free_port()
    pool.prefill("127.0.0.1", nobody, 2, timeout=1).join(30)
    assert pool.idle("127.0.0.1", nobody) == 0
