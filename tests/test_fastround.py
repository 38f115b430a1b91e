"""The fast path between rounds (cluster.fastround): its decision logic over an injected in-memory store,
with agents as threads; and, through the replayed agent loop, which rounds may take it."""

from __future__ import annotations

import datetime
import hashlib
import threading
import time

import pytest
from torch.distributed import DistStoreError

from mbr_launch.cluster import fastround
from mbr_launch.cluster.fastround import Agreement, Fallback, agree, abort, next_token, pack, unpack

pytestmark = pytest.mark.timeout(30)


def _bytes(value: str | bytes) -> bytes:
    return value if isinstance(value, bytes) else value.encode()


class MemoryStore:
    """torch's Store semantics for add / compare_set / wait / get, in memory; ``ops`` counts round trips."""

    def __init__(self) -> None:
        self._data: dict[str, bytes] = {}
        self._changed = threading.Condition()
        self.ops: dict[str, int] = {}

    def _count(self, op: str) -> None:
        self.ops[op] = self.ops.get(op, 0) + 1

    def add(self, key: str, value: int) -> int:
        with self._changed:
            self._count("add")
            total = int(self._data.get(key, b"0")) + value
            self._data[key] = str(total).encode()
            self._changed.notify_all()
            return total

    def compare_set(self, key: str, expected: str | bytes, desired: str | bytes) -> bytes:
        expected_b, desired_b = _bytes(expected), _bytes(desired)  # torch's store takes either
        with self._changed:
            self._count("compare_set")
            current = self._data.get(key)
            if (current is None and expected_b == b"") or current == expected_b:
                self._data[key] = desired_b
                self._changed.notify_all()
                return desired_b
            return current if current is not None else expected_b

    def wait(self, keys: list[str], timeout: datetime.timedelta) -> None:
        with self._changed:
            self._count("wait")
            if not self._changed.wait_for(lambda: all(k in self._data for k in keys), timeout.total_seconds()):
                raise DistStoreError("Socket Timeout")  # what torch raises

    def check(self, keys: list[str]) -> bool:
        with self._changed:
            self._count("check")
            return all(k in self._data for k in keys)

    def get(self, key: str) -> bytes:
        with self._changed:
            self._count("get")
            return self._data[key]


def _agents(store: MemoryStore, ranks: list[int], nodes: int, *, timeout: float = 5.0, port: int = 23456,
            restarts: int = 3) -> dict[int, fastround.Outcome]:
    out: dict[int, fastround.Outcome] = {}

    def one(rank: int) -> None:
        out[rank] = agree(store, group_rank=rank, nodes=nodes, token="tok", timeout=timeout,
                          master_port=port if rank == 0 else 0, restarts=restarts if rank == 0 else 0)

    threads = [threading.Thread(target=one, args=(r,)) for r in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    return out


def token_of(store: MemoryStore, token: str = "tok") -> str:
    """The next round's token, from the decision stored (its nonce) and the failed round's token."""
    return next_token(token, store.get(fastround.DECIDED_KEY).decode().rsplit(":", 1)[1])


def test_pack_round_trips_and_refuses_what_does_not_fit():
    assert unpack(pack(7, 65535, 12345)) == (7, 65535, 12345)
    assert unpack(pack(1, 23456, 0) + 3 * pack(1)) == (4, 23456, 0)  # the others' additions only count
    with pytest.raises(ValueError):
        pack(1, 70000, 0)


def test_single_node_agrees_in_one_add_and_one_compare_set():
    store = MemoryStore()
    out = agree(store, group_rank=0, nodes=1, token="tok", timeout=1, master_port=20001, restarts=2)
    assert out == Agreement(token=token_of(store), master_port=20001, restart_count=2)
    assert store.ops["add"] == 1 and store.ops["compare_set"] == 1  # no wait: nothing to wait for
    assert "check" not in store.ops and "wait" not in store.ops
    assert next_token("tok", "ab") != "tok" and next_token(next_token("tok", "ab"), "ab") != next_token("tok", "ab")


def test_every_agent_gets_rank_zeros_port_and_count_whoever_arrives_last():
    store = MemoryStore()
    out = _agents(store, [3, 1, 0, 2], nodes=4)
    assert set(out) == {0, 1, 2, 3}
    assert set(out.values()) == {Agreement(token=token_of(store), master_port=23456, restart_count=3)}
    assert store.ops["add"] == 4 and store.ops["compare_set"] == 1  # one decision, by the last to arrive


def test_a_missing_agent_sends_everyone_to_the_full_join_after_the_timeout():
    store = MemoryStore()
    out = _agents(store, [0, 1], nodes=3, timeout=0.3)
    assert set(out) == {0, 1}
    assert all(isinstance(o, Fallback) and "not all 3 agents arrived" in o.reason for o in out.values())
    # the late agent arrives after the decision: it follows it, it does not start a round of its own
    late = agree(store, group_rank=2, nodes=3, token="tok", timeout=0.3)
    assert isinstance(late, Fallback)


def test_one_agent_that_must_not_take_the_fast_path_stops_the_others_at_once():
    store = MemoryStore()
    box: dict[str, fastround.Outcome] = {}
    waiter = threading.Thread(target=lambda: box.setdefault("o", agree(store, group_rank=0, nodes=2, token="tok",
                                                                         timeout=10, master_port=20001)))
    waiter.start()
    assert abort(store, "a node was lost", token="tok", nodes=2) == Fallback("a node was lost")
    waiter.join(5)
    assert box["o"] == Fallback("a node was lost")  # well before its 10 s timeout


def test_the_first_decision_stands_for_everyone():
    store = MemoryStore()
    assert agree(store, group_rank=0, nodes=1, token="tok", timeout=1, master_port=20001) == \
        Agreement(token=token_of(store), master_port=20001, restart_count=0)
    # an abort that comes later does not undo it: that agent must take the agreed round too
    assert isinstance(abort(store, "late", token="tok", nodes=1), Agreement)


def test_more_arrivals_than_nodes_fall_back():
    store = MemoryStore()
    store.add(fastround.ARRIVED_KEY, 2)
    assert isinstance(agree(store, group_rank=1, nodes=2, token="tok", timeout=1), Fallback)


NONCE = "0f" * 16  # fastround.NONCE_BYTES of hex


def test_a_broken_decision_falls_back():
    assert "unreadable" in fastround.read_decision(f"go:notanumber:{NONCE}", token="t", nodes=1).reason
    assert "port 0" in fastround.read_decision(f"go:{pack(1)}:{NONCE}", token="t", nodes=1).reason  # no port
    assert isinstance(fastround.read_decision(b"???", token="t", nodes=1), Fallback)
    assert fastround.read_decision(f"go:{pack(1, 20001)}:{NONCE}", token="t", nodes=1) == \
        Agreement(token=next_token("t", NONCE), master_port=20001, restart_count=0)


def test_the_next_rounds_token_cannot_be_computed_before_the_decision():
    """Issue #29 (e): the token derived from the failed round's alone (sha1 of "<token>/fast") let a neighbour
    plant an exit-0 stop under the next round's keys ahead of the restart. The decision's random nonce makes
    every decision's token new, and a decision without one (planted, or from an older agent) takes nobody to
    the fast round."""
    tokens = set()
    for _ in range(3):  # the same failed round, decided three times
        out = agree(MemoryStore(), group_rank=0, nodes=1, token="tok", timeout=1, master_port=20001)
        assert isinstance(out, Agreement)
        tokens.add(out.token)
    assert len(tokens) == 3
    assert hashlib.sha1(b"tok/fast").hexdigest()[:12] not in tokens  # the token the old derivation predicted
    for planted in (f"go:{pack(1, 20001)}", f"go:{pack(1, 20001)}:", f"go:{pack(1, 20001)}:xyz"):
        assert "without a nonce" in fastround.read_decision(planted, token="tok", nodes=1).reason


# ---- which rounds may take it: the real loop, replayed ---------------------------------------------------

def test_the_loop_offers_the_failed_round_and_says_why_not(tmp_path):
    from mbr_launch.agent.messages import RankStarted
    from mbr_launch.cluster.peers import PeerLost
    from tests.replay import all_exit, build_world, kill_rank, post

    for sub in ("plain", "spares", "lost"):
        (tmp_path / sub).mkdir()
    script = [post(RankStarted(0)), kill_rank(1), all_exit(0)]
    world = build_world(tmp_path / "plain", ("max_restarts", 1))
    assert world.run(script) == 0
    assert world.rendezvous.asked == [(None, None), (0, None)]  # a rank crashed: same members, fast path offered

    world = build_world(tmp_path / "spares", ("max_restarts", 1), spares=1)
    assert world.run(script) == 0
    assert world.rendezvous.asked[1] == (0, "1 node(s) wait outside the round")

    world = build_world(tmp_path / "lost", ("max_restarts", 1), nodes=2)
    assert world.run([post(RankStarted(0)), post(PeerLost(group_rank=1, silent_for=20.0)), all_exit(0)]) == 0
    assert world.rendezvous.asked[1] == (0, "a node was lost")


def test_a_waiting_agent_waits_in_the_store_in_slices_and_gives_up_at_its_timeout():
    # No polling (#41): one store wait per WAIT_SLICE until the timeout, each short enough that torch's
    # keep-alive on the same connection gets its turn; a check only once the time is up.
    store = MemoryStore()
    started = time.monotonic()
    out = agree(store, group_rank=1, nodes=2, token="tok", timeout=1.2)
    assert isinstance(out, Fallback) and "within 1.2 s" in out.reason
    assert time.monotonic() - started >= 1.2
    assert store.ops["wait"] <= 1.2 / fastround.WAIT_SLICE + 2 and store.ops.get("check", 0) <= 1


def test_a_waiting_agent_returns_the_moment_the_decision_is_written():
    store = MemoryStore()
    box: dict = {}
    waiter = threading.Thread(target=lambda: box.setdefault("o", agree(store, group_rank=1, nodes=2, token="tok",
                                                                         timeout=20)))
    waiter.start()
    time.sleep(0.2)
    started = time.monotonic()
    decided = agree(store, group_rank=0, nodes=2, token="tok", timeout=20, master_port=20001, restarts=1)
    waiter.join(10)
    assert not waiter.is_alive() and time.monotonic() - started < 5  # not the 20 s timeout
    assert box["o"] == decided and isinstance(decided, Agreement)
    assert store.ops.get("check", 0) == 0