"""The agent's dispatch table: every kind of event has its handler, and what still matters once this node's
workers are done is one explicit set. (What the handlers do: tests/test_agent_replay.py.)"""

from __future__ import annotations

import typing

import pytest

from mbr_launch.agent import handlers
from mbr_launch.agent.messages import AllDone, Event, MonitorWarning, PeerStopped
from mbr_launch.cluster.peers import PeerLost, StoreLost

pytestmark = pytest.mark.timeout(30)


def test_every_event_has_a_handler():
    kinds = set(typing.get_args(Event))
    assert set(handlers.HANDLERS) == kinds
    assert handlers.AFTER_LOCAL_DONE <= kinds


def test_after_local_done_only_the_other_nodes_news_matters():
    assert handlers.AFTER_LOCAL_DONE == {PeerStopped, PeerLost, StoreLost, AllDone, MonitorWarning}


class Mine:
    pass


class Theirs:
    pass


def test_dispatch_follows_the_table(monkeypatch):
    called: list[str] = []
    monkeypatch.setattr(handlers, "HANDLERS", {Mine: lambda ctx, rnd, e: called.append("mine") or "restart",
                                               Theirs: lambda ctx, rnd, e: called.append("theirs")})
    monkeypatch.setattr(handlers, "AFTER_LOCAL_DONE", frozenset({Theirs}))
    ctx = rnd = typing.cast(typing.Any, None)
    assert handlers.dispatch(ctx, rnd, Mine(), local_done=False) == "restart"
    assert handlers.dispatch(ctx, rnd, Mine(), local_done=True) is None  # not even called
    assert handlers.dispatch(ctx, rnd, Theirs(), local_done=True) is None
    assert handlers.dispatch(ctx, rnd, object(), local_done=False) is None  # an unknown kind: go on
    assert called == ["mine", "theirs"]
