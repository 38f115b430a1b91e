"""torch's rendezvous event names from a frame lookup instead of inspect.stack (cluster.torch_internals): the same
names, without reading source."""

from __future__ import annotations

import inspect

import pytest
from torch.distributed.elastic.rendezvous import dynamic_rendezvous

from mbr_launch.cluster import torch_internals

pytestmark = pytest.mark.timeout(30)


def _outer(name_of):
    return _inner(name_of)


def _inner(name_of):
    return name_of()


def test_the_name_is_torchs_and_no_source_is_read(monkeypatch):
    original = dynamic_rendezvous.get_method_name
    if original is not torch_internals.get_method_name:  # torch's own, before any agent of this process swapped it
        assert _outer(original) == "_outer"
    assert torch_internals.replace_event_names().installed
    assert dynamic_rendezvous.get_method_name is torch_internals.get_method_name
    monkeypatch.setattr(inspect, "stack", lambda *a, **k: pytest.fail("inspect.stack read the source"))
    assert _outer(dynamic_rendezvous.get_method_name) == "_outer"  # depth 2: the caller of _record's caller
    assert torch_internals.get_method_name(depth=10_000) == "no_method_name"
    assert torch_internals.replace_event_names().installed  # twice is harmless


def test_a_handlers_own_record_uses_it(monkeypatch):
    torch_internals.replace_event_names()
    monkeypatch.setattr(inspect, "stack", lambda *a, **k: pytest.fail("inspect.stack read the source"))
    names = []
    monkeypatch.setattr(dynamic_rendezvous, "construct_and_record_rdzv_event", lambda **kw: names.append(kw["name"]))
    holder = object.__new__(dynamic_rendezvous._BackendRendezvousStateHolder)
    holder._settings = type("S", (), {"run_id": "r"})()

    def sync_like():
        holder._record(message="m")

    sync_like()
    assert names == ["_BackendRendezvousStateHolder.sync_like"]
