"""PeerWatch against a real TCPStore: a store host slow to come up is not a lost store; a gone one is."""

from __future__ import annotations

import datetime
import socket
import struct
import time
from dataclasses import dataclass

import pytest
from torch.distributed import PrefixStore, TCPStore

from mbr_launch.cluster.peers import PeerWatch, Silence, StoreLost
from mbr_launch.cluster.round import Round
from mbr_launch.decide.liveness import Beat

from testkit.helpers import free_port

pytestmark = pytest.mark.timeout(60)


@dataclass
class _Round:
    """The fields PeerWatch reads from a rendezvous Round, and Round's own connect_control."""
    store_port: int
    store_host: str = "127.0.0.1"
    control_prefix: str = "test/control/"
    group_rank: int = 1
    group_world_size: int = 2
    index: int = 0
    connect_control = Round.connect_control


def _watch(rnd: _Round, timeout: float) -> tuple[PeerWatch, list[dict]]:
    lost: list[Silence] = []
    watch = PeerWatch(rnd, timeout=timeout, on_lost=lost.append)  # type: ignore[arg-type]
    watch.start()
    return watch, lost


def _resetting_listener(port: int, seconds: float) -> None:
    """Accept and reset every connection for `seconds` (an overloaded store host dropping clients), then
    free the port."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen()
        listener.settimeout(0.05)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                conn, _ = listener.accept()
            except socket.timeout:
                continue
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()  # RST: "Connection reset by peer" in the client's connect/validate


def test_a_store_that_resets_connections_for_a_while_is_not_lost():
    port = free_port()
    watch, lost = _watch(_Round(store_port=port), timeout=4.0)
    _resetting_listener(port, 1.5)  # retried, not fatal
    server = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                      timeout=datetime.timedelta(seconds=30))
    keys = PrefixStore(_Round.control_prefix, server)  # the watcher's view of the same keys
    try:
        end = time.monotonic() + 5
        while time.monotonic() < end and not lost and not keys.check(["hb/1"]):
            time.sleep(0.05)
        assert not lost, lost
        assert keys.check(["hb/1"]), "the watcher never bumped its counter"
        first = Beat.decode(keys.get("hb/1")).count
        time.sleep(1.5)
        assert Beat.decode(keys.get("hb/1")).count > first and not lost  # still beating
        assert watch.store_silence() is None
    finally:
        watch.cancel()
        watch.join(10)


def test_a_store_that_never_answers_is_lost_after_the_timeout():
    port = free_port()
    started = time.monotonic()
    watch, lost = _watch(_Round(store_port=port), timeout=2.0)
    end = time.monotonic() + 10
    while time.monotonic() < end and not lost:
        time.sleep(0.05)
    watch.join(10)
    assert len(lost) == 1 and isinstance(lost[0], StoreLost), lost
    assert f"127.0.0.1:{port}" in lost[0].detail
    assert 2.0 <= time.monotonic() - started < 6.0
