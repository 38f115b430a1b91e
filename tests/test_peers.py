"""PeerWatch against a real TCPStore: a store host slow to come up is not a lost store; a gone one is."""

from __future__ import annotations

import datetime
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field

import pytest
from torch.distributed import PrefixStore, TCPStore

from mbr_launch.cluster.peers import PeerWatch, Silence, StoreLost
from mbr_launch.cluster.round import Round
from mbr_launch.cluster.storevalue import Sealer
from mbr_launch.decide.liveness import Beat, Seen

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
    control: PrefixStore | None = None  # the round's control keys (``cluster.departures`` writes there)
    sealer: Sealer = field(default_factory=Sealer)  # the job's (no secret)
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
    assert time.monotonic() - started >= 2.0  # not before the timeout (how soon after is a benchmark's matter)


MUTE_LISTENER = """
import socket, sys, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen(64)
print("listening", flush=True)
held = []
while True:
    conn, _ = s.accept()
    held.append(conn)  # never answers: a store host starved before its first answer
"""


@pytest.mark.processes
def test_a_store_host_alive_on_this_machine_is_not_lost_before_its_first_answer_and_is_once_stopped():
    """256 agents starting on 16 cores: the store's host, starved, had not answered one watcher in 17 s, before
    it could name itself in the store, and the watcher ended the job. The process listening on the store's
    port here is its host: alive (sleeping), it is waited for; stopped, the store is lost."""
    port = free_port()
    host = subprocess.Popen([sys.executable, "-c", MUTE_LISTENER, str(port)], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    watch = None
    try:
        assert host.stdout is not None and host.stdout.readline().strip() == "listening"
        watch, _lost = _watch(_Round(store_port=port), timeout=1.0)
        # The agent's loop asks for the silence (its own store calls may hang on the mute store meanwhile).
        end = time.monotonic() + 5.0  # five timeouts without an answer
        while time.monotonic() < end:
            assert watch.store_silence() is None
            time.sleep(0.1)
        os.kill(host.pid, signal.SIGSTOP)
        end, silent = time.monotonic() + 20, None
        while time.monotonic() < end and silent is None:
            silent = watch.store_silence()
            time.sleep(0.05)
        assert silent is not None and silent >= 1.0, silent
    finally:
        if watch is not None:
            watch.cancel()
        os.killpg(host.pid, signal.SIGKILL)
        host.wait(10)
        if watch is not None:
            watch.join(10)


def test_a_node_that_left_is_not_lost_and_the_next_rank_watches_in_its_place():
    """Group rank 0 (the watching node) leaves the round of three: it names itself in the round's departures and
    beats no more. Rank 1 takes its part (it watches rank 2, and nobody takes rank 0 for lost); when rank 2 then
    falls silent without leaving, rank 1 is the one that says so."""
    from mbr_launch.cluster import departures
    from mbr_launch.cluster.peers import PeerLost, PeersLeft

    port = free_port()
    server = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=30))
    control = PrefixStore(_Round.control_prefix, server)
    seen: dict[int, list] = {1: [], 2: []}
    watches = {}
    for rank in (1, 2):
        rnd = _Round(store_port=port, group_rank=rank, group_world_size=3)
        # as if each ran on a machine of its own: only beats tell (here, one live process hosts both watches)
        watches[rank] = PeerWatch(rnd, timeout=2.0, on_lost=seen[rank].append, on_left=seen[rank].append,  # type: ignore[arg-type]
                                  seen=lambda _who, _me: Seen.SILENT)
    try:
        for watch in watches.values():
            watch.start()
        assert watches[2].watched() == [0] and watches[1].watched() == [0]
        departures.mark_left(_Round(store_port=port, group_rank=0, group_world_size=3, control=control), 0)  # type: ignore[arg-type]
        end = time.monotonic() + 6  # three timeouts: rank 0 was silent all along
        while time.monotonic() < end:
            time.sleep(0.1)
        assert seen == {1: [PeersLeft((0,))], 2: [PeersLeft((0,))]}, seen
        assert watches[1].watched() == [2] and watches[2].watched() == [1]
        watches[2].cancel()
        watches[2].join(10)
        end = time.monotonic() + 10
        while time.monotonic() < end and len(seen[1]) < 2:
            time.sleep(0.1)
        assert isinstance(seen[1][-1], PeerLost) and seen[1][-1].group_rank == 2, seen[1]
    finally:
        for watch in watches.values():
            watch.cancel()
            watch.join(10)
