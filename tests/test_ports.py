"""The workers' fresh MASTER_PORT keeps MASTER_PORT+1 and +2 free for NVRx in-process restart's stores."""

from __future__ import annotations

import socket

import pytest

from mbr_launch.cluster.workerstore import SPAN, ephemeral_range, pick_master_port, span_free

pytestmark = pytest.mark.timeout(30)


def _free_run(length: int) -> int:
    """A port b with b .. b+length-1 all free right now (below the ephemeral range, like the picker's)."""
    low, _ = ephemeral_range()
    for base in range(max(10000, low - 2000), low - length, 7):
        if span_free(base, length):
            return base
    pytest.skip("no run of free ports below the ephemeral range on this machine")


def _listen(port: int) -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", port))
    sock.listen()
    return sock


def test_span_free_sees_each_of_the_three_ports():
    base = _free_run(6)
    assert span_free(base)
    for offset in range(SPAN):
        with _listen(base + offset):
            assert not span_free(base), offset
    with _listen(base + SPAN):
        assert span_free(base)  # the port after the span is not ours to need


def test_a_taken_plus_one_or_plus_two_rules_the_candidate_out():
    base = _free_run(9)
    with _listen(base + 1), _listen(base + 5):  # rules out base (its +1) and base+3 (its +2)
        for _ in range(10):  # candidates are tried in random order
            assert pick_master_port(candidates=[base, base + 3, base + 6]) == base + 6


def test_pick_checks_every_candidate_it_returns():
    tried = []

    def free(port: int) -> bool:
        tried.append(port)
        return port == 20002

    assert pick_master_port(candidates=range(20000, 20010), attempts=10, free=free) == 20002
    assert 20002 in tried


def test_default_pick_is_outside_the_ephemeral_range_with_its_span_free():
    low, high = ephemeral_range()
    port = pick_master_port()
    assert port + SPAN - 1 < low or port > high


def test_nothing_free_anywhere_is_an_error_not_a_narrower_port():
    with pytest.raises(OSError, match="consecutive free ports"):
        pick_master_port(candidates=range(20000, 20004), attempts=4, free=lambda port: False)
