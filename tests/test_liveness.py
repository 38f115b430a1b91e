"""Silence judged by decide.liveness (issue #38), with injected clocks: a starved watcher, a starved peer on
the same machine, a dead or stopped peer, a slow store and a cut one; and peers' /proc view of real
processes (running, stopped, gone)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from mbr_launch.cluster import peers
from mbr_launch.decide.liveness import (CREDIT_TICKS, SLOW_FACTOR, Beat, Identity, OwnTime, Seen, Silence,
                                        SlowestAnswer, grace)

pytestmark = pytest.mark.timeout(60)

TIMEOUT = 15.0
PERIOD = 0.25  # peers.TICK
INTERVAL = TIMEOUT / 4  # PeerWatch's


def _first_verdict(beats_until: float, *, tick_every: float, seen: Seen = Seen.SILENT, end: float = 300.0,
                   slowest: float = 0.0) -> float | None:
    """Wall time at which a watcher (looking every INTERVAL, its own clock ticked every ``tick_every`` seconds,
    late when that is above PERIOD) first finds a peer silent past its grace; the peer beats until
    ``beats_until``. None: never within ``end`` seconds."""
    own = OwnTime(0.0, PERIOD)
    meter = Silence(0.0)
    limit = grace(TIMEOUT, slowest)
    t, next_look = 0.0, INTERVAL
    while t < end:
        t = round(t + tick_every, 6)
        own.tick(t)
        if t >= next_look:
            next_look = t + INTERVAL
            if meter.observe(own.credited, sign=t < beats_until, seen=seen) >= limit:
                return t
    return None


def test_a_dead_peer_on_an_idle_machine_is_found_within_the_timeout_plus_one_look():
    found = _first_verdict(30.0, tick_every=PERIOD)  # its last beat seen at most one look before it died
    assert found is not None and TIMEOUT - INTERVAL <= found - 30.0 <= TIMEOUT + INTERVAL


def test_a_starved_watcher_counts_only_the_time_it_was_served():
    # every process here waits 5 s for a CPU: the watcher's own clock credits 0.5 s a tick, so 15 s of
    # wall-clock silence is 1.5 s of own time; the verdict comes, 10 times later, if the silence goes on
    assert _first_verdict(30.0, tick_every=5.0, end=30.0 + 5 * TIMEOUT) is None
    found = _first_verdict(30.0, tick_every=5.0, end=1000.0)
    assert found is not None and found - 30.0 >= TIMEOUT * 5.0 / (CREDIT_TICKS * PERIOD) - 5.0  # less a look


def test_a_peer_seen_alive_on_this_machine_is_never_silent():
    assert _first_verdict(0.0, tick_every=PERIOD, seen=Seen.ALIVE, end=600.0) is None


def test_a_stopped_or_gone_peer_here_counts_as_silent():
    found = _first_verdict(0.0, tick_every=PERIOD, seen=Seen.SILENT)
    assert found is not None and found <= TIMEOUT + INTERVAL


def test_a_slow_store_widens_the_grace_and_an_idle_one_does_not():
    slow = SlowestAnswer(half_life=TIMEOUT)
    slow.seen(0.002, now=0.0)
    assert grace(TIMEOUT, slow.at(0.0)) == pytest.approx(TIMEOUT, abs=0.01)  # a cut idle store: the timeout
    slow.seen(6.0, now=1.0)  # a starved host took 6 s to answer
    assert grace(TIMEOUT, slow.at(1.0)) == pytest.approx(TIMEOUT + SLOW_FACTOR * 6.0)
    slow.seen(0.001, now=2.0)  # a fast answer does not forget the slow one at once
    assert slow.at(2.0) == pytest.approx(6.0 * 0.5 ** (1 / TIMEOUT))
    assert slow.at(1.0 + 10 * TIMEOUT) < 0.01  # ... but after ten half-lives it has
    found = _first_verdict(30.0, tick_every=PERIOD, slowest=6.0)
    assert found is not None and found - 30.0 >= TIMEOUT + SLOW_FACTOR * 6.0 - INTERVAL  # less a look


def test_a_sign_of_life_resets_the_silence():
    meter = Silence(0.0)
    assert meter.observe(10.0, sign=False, seen=Seen.SILENT) == 10.0
    assert meter.observe(11.0, sign=True, seen=Seen.SILENT) == 0.0
    assert meter.observe(12.0, sign=False, seen=Seen.SILENT) == 1.0
    assert meter.observe(13.0, sign=False, seen=Seen.ALIVE) == 0.0


def test_own_time_credits_at_most_two_periods_a_tick_and_never_runs_backwards():
    own = OwnTime(100.0, 0.5)
    assert own.tick(100.5) == 0.5
    assert own.tick(110.5) == 1.5  # 10 s late: 1 s of it
    assert own.tick(105.0) == 1.5  # a clock that went back credits nothing


ME = Identity("0a1b2c3d-aaaa-bbbb-cccc-0123456789ab", 4026531836, 4026531840, 1234, 99)


@pytest.mark.parametrize("text", [
    "", "x", ME.encode() + " 1", "ZZZ 1 2 3 4", "abc 1 2 0 4", "abc 1 2 -5 4", "abc 1 2 3 -1", "abc a 2 3 4",
    "abc 1 2 99999999999 4", "a" * 300, "abc 1 2 3 4\n", "abc\x00 1 2 3 4",
])
def test_an_identity_from_the_store_that_is_not_one_names_no_process(text):
    assert Identity.decode(text) is None


def test_identities_round_trip_and_name_the_same_machine_only_in_the_same_namespaces():
    assert Identity.decode(ME.encode()) == ME
    assert ME.same_machine(Identity(ME.boot_id, ME.pid_ns, ME.net_ns, 5, 6))
    assert not ME.same_machine(Identity(ME.boot_id, ME.pid_ns, ME.net_ns + 1, 5, 6))  # another netns: cuttable
    assert not ME.same_machine(Identity("ffff", ME.pid_ns, ME.net_ns, 5, 6))


@pytest.mark.parametrize("raw,count,named", [
    (Beat(7, ME).encode(), 7, True), (Beat(3, None).encode(), 3, False), (b"", -1, False),
    (b"\xff\xfe garbage", -1, False), (b"12", 12, False), (b"9" * 5000, -1, False),
])
def test_beats_decode_whatever_the_store_holds(raw, count, named):
    beat = Beat.decode(raw)
    assert beat.count == count and (beat.identity == ME) is named


@pytest.mark.processes
def test_this_machine_sees_a_process_running_stopped_and_gone():
    me = peers.my_identity()
    assert me is not None and me.pid == os.getpid()
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        deadline = time.monotonic() + 10
        stat = None
        while stat is None and time.monotonic() < deadline:
            stat = peers.procstat.read(proc.pid)
        assert stat is not None
        child = Identity(me.boot_id, me.pid_ns, me.net_ns, proc.pid, stat.start_time)
        assert peers.seen(child, me) is Seen.ALIVE
        assert peers.seen(Identity(me.boot_id, me.pid_ns, me.net_ns, proc.pid, stat.start_time + 1), me) \
            is Seen.SILENT  # the same pid, another process
        assert peers.seen(Identity("ffff", me.pid_ns, me.net_ns, proc.pid, stat.start_time), me) is Seen.SILENT
        os.kill(proc.pid, signal.SIGSTOP)
        while peers.seen(child, me) is Seen.ALIVE and time.monotonic() < deadline:
            time.sleep(0.01)
        assert peers.seen(child, me) is Seen.SILENT  # state T
        os.kill(proc.pid, signal.SIGCONT)
        while peers.seen(child, me) is not Seen.ALIVE and time.monotonic() < deadline:
            time.sleep(0.01)
        assert peers.seen(child, me) is Seen.ALIVE
        proc.kill()
        proc.wait(10)
        assert peers.seen(child, me) is Seen.SILENT
    finally:
        proc.kill()
        proc.wait(10)


def test_own_time_runs_with_the_real_clock_when_this_process_is_served():
    a, t = peers.own_time(), time.monotonic()
    time.sleep(0.6)
    credited, wall = peers.own_time() - a, time.monotonic() - t
    assert 0.5 <= credited <= wall + 0.01


def test_the_store_guard_waits_on_while_the_stores_host_is_alive_here_and_ends_once_it_is_not():
    from mbr_launch.cluster.storeguard import StoreGuard

    now = [0.0]
    alive = [True]
    expired: list[tuple[str, float]] = []
    guard = StoreGuard(lambda what, seconds: expired.append((what, seconds)), clock=lambda: now[0], tick=0.01,
                       alive=lambda: alive[0])
    guard.start()
    try:
        with guard.around(10.0, "reporting this node done"):
            now[0] = 100.0  # ten bounds later: the call is slow, its store's host runs here
            time.sleep(0.2)
            assert expired == [] and guard.blocked_in() == "reporting this node done"
            alive[0] = False  # stopped or gone: the bound given again at 100 s passes at 110 s
            now[0] = 109.0
            time.sleep(0.2)
            assert expired == []
            now[0] = 111.0
            deadline = time.monotonic() + 10
            while not expired and time.monotonic() < deadline:
                time.sleep(0.01)
        assert expired == [("reporting this node done", 111.0)]
    finally:
        guard.close()
