"""Unit tests of cluster.torch_internals.may_close: when a failure round may close without torch's last call."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (RendezvousSettings, RendezvousTimeout, _NodeDesc,
                                                                     _RendezvousState)

from mbr_launch.cluster.torch_internals import SETTLE, may_close

NOW = datetime(2026, 12, 1, tzinfo=timezone.utc)
LAST_CALL = timedelta(seconds=30)
A, B, C = (_NodeDesc(f"h{i}", 100 + i, 0) for i in range(3))


def _settings(min_nodes: int = 2, max_nodes: int = 3) -> RendezvousSettings:
    return RendezvousSettings("job", min_nodes, max_nodes, RendezvousTimeout(last_call=LAST_CALL),
                              timedelta(seconds=1), 2)


def _state(*participants: _NodeDesc, min_reached_ago: float = SETTLE + 0.1) -> _RendezvousState:
    state = _RendezvousState()
    state.participants = {p: 0 for p in participants}
    state.deadline = NOW - timedelta(seconds=min_reached_ago) + LAST_CALL
    return state


def test_survivors_close_once_settled_and_nobody_else_announced():
    assert may_close(_state(A, B), A, _settings(), now=NOW)


def test_not_before_the_settle_pause():
    assert not may_close(_state(A, B, min_reached_ago=SETTLE / 2), A, _settings(), now=NOW)


def test_an_announced_joiner_or_spare_is_waited_for():
    waiting = _state(A, B)
    waiting.wait_list = {C}
    assert not may_close(waiting, A, _settings(), now=NOW)
    spare = _state(A, B)
    spare.redundancy_list = {C}
    assert not may_close(spare, A, _settings(), now=NOW)


def test_below_min_or_not_a_participant_or_already_complete():
    assert not may_close(_state(A), A, _settings(), now=NOW)  # below MIN: torch sets no deadline either
    assert not may_close(_state(A, B), C, _settings(), now=NOW)
    done = _state(A, B)
    done.complete = True
    assert not may_close(done, A, _settings(), now=NOW)
    closed = _state(A, B)
    closed.closed = True
    assert not may_close(closed, A, _settings(), now=NOW)
