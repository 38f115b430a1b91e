"""torch's private rendezvous parts, patched for the restart speed-ups (``cluster.torch_internals``): every
patch installs on the torch we test with, and one that faces a torch without its private part says so (the
patch's record, the agent's start-up line and event, ``mbr-launch doctor``) instead of quietly losing the
speed-up. A missing part is made by taking the attribute away from torch's real modules and objects."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from torch.distributed import HashStore
from torch.distributed.elastic.rendezvous import (RendezvousParameters, RendezvousTimeoutError, dynamic_rendezvous,
                                                  utils)
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

from mbr_launch.agent.lifecycle import Agent
from mbr_launch.agent.wakeup import StuckSignals
from mbr_launch.agent.wakeup import Wakeup
from mbr_launch.api import build_launch_config
from mbr_launch.cluster import joining, rdzvstore, torch_internals
from mbr_launch.cluster.rendezvous import Rendezvous
from mbr_launch.cluster.storeguard import StoreGuard
from mbr_launch.doctor import DoctorContext, check_ids, run_checks
from mbr_launch.doctor.probes import Versions
from testkit.helpers import free_port

pytestmark = pytest.mark.timeout(60)

NAMES = {"event_names", "join_wake", "early_close", "leave", "state_reads", "store_address", "store_socket"}
# A part taken away from torch -> the patches that then do not install, and the reason's words.
MISSING = [
    (dynamic_rendezvous, "get_method_name", {"event_names"}, "dynamic_rendezvous has no get_method_name"),
    (dynamic_rendezvous, "_delay", {"join_wake"}, "dynamic_rendezvous has no _delay"),
    (dynamic_rendezvous, "_RendezvousJoinOp", {"early_close"}, "dynamic_rendezvous has no _RendezvousJoinOp"),
    (dynamic_rendezvous, "_RendezvousExitOp", {"leave"}, "dynamic_rendezvous has no _RendezvousExitOp"),
    (DynamicRendezvousHandler, "_stop_heartbeats", {"leave"}, "the handler has no _stop_heartbeats"),
    (utils, "_matches_machine_hostname", {"store_socket"}, "rendezvous.utils has no _matches_machine_hostname"),
    # torch's handler cannot even be made to look at: every patch on a handler says so
    (dynamic_rendezvous, "_RendezvousState", NAMES - {"event_names", "store_socket"},
     "cannot make torch's c10d handler to look at: NameError"),
]
MISSING_IDS = [f"{getattr(owner, '__name__', owner)}.{name}" for owner, name, _, _ in MISSING]


def _handler(max_nodes: int = 1) -> DynamicRendezvousHandler:
    """torch's own c10d handler over an in-memory store (no socket), for 1 to ``max_nodes`` nodes."""
    store = HashStore()
    return DynamicRendezvousHandler.from_backend("t", store, C10dRendezvousBackend(store, "t"), 1, max_nodes,
                                                 local_addr="t")


def _config(tmp_path: Path, backend: str = "c10d"):
    (tmp_path / "train.py").write_text("pass\n")
    cli = {"nnodes": "1", "rdzv_backend": backend, "rdzv_id": "internals", "log_dir": str(tmp_path),
           "standby": "off", "rank_monitor": "off", "nproc_per_node": "1"}
    cli["rdzv_endpoint"] = f"127.0.0.1:{free_port()}"
    if backend == "static":  # one node of static is made standalone c10d: a node of two then
        cli.update(nnodes="2", node_rank="0")
    return build_launch_config(cli=cli, script=str(tmp_path / "train.py"), environ={})


# ---- the torch we test with: every patch takes -------------------------------------------------------

@pytest.mark.parametrize("kind", torch_internals.PATCHES, ids=lambda k: k.name)
def test_every_patch_installs_on_this_torch(kind):
    [patch] = [p for p in torch_internals.status() if p.name == kind.name]
    assert patch.installed, f"{patch.name} does not install on this torch: {patch.why_not}"
    assert patch.buys and patch.without and not patch.why_not


def test_the_patch_list_is_the_one_documented_here():
    assert {p.name for p in torch_internals.status()} == NAMES  # a new patch: add it here and to the tests
    assert torch_internals.lost_line(torch_internals.status()) is None


def test_a_real_c10d_join_takes_every_patch_and_leaves(tmp_path):
    """One node joins a real c10d rendezvous on this machine: the patches its handler took, the reads and
    the leave that go through torch's internals."""
    rendezvous = Rendezvous(_config(tmp_path))
    assert rendezvous.existing_handler() is None and rendezvous.patches == ()  # nothing made before a join
    try:
        rnd = rendezvous.next_round()
        handler = rendezvous.existing_handler()
        assert handler is rendezvous.handler
        took = {p.name: p for p in rendezvous.patches}
        assert set(took) == {"store_socket", "early_close", "event_names", "join_wake"}
        assert all(p.installed for p in took.values()), [p for p in took.values() if not p.installed]
        assert dynamic_rendezvous.get_method_name is torch_internals.get_method_name
        assert dynamic_rendezvous._delay is joining._delay
        assert torch_internals.handler_store(handler).port == rnd.store_port
        state = rendezvous.state()  # state_reads: our own read of torch's pickled state
        assert state is not None and state.joined == 1 and state.complete and state.outside == 0
        view = torch_internals.read_state_locked(handler)  # spare_count's slow way, through the handler
        assert len(view.members) == 1 and view.complete and not view.waiting and not view.spares
        assert rendezvous.spare_count() == 0
    except BaseException:
        rendezvous.shutdown()
        raise
    assert rendezvous.leave() is None  # left without closing: torch's exit operation ran
    assert rendezvous.existing_handler() is None


@pytest.mark.parametrize("listed", ["wait_list", "redundancy_list"])
def test_a_node_that_leaves_is_out_of_the_wait_list_and_the_spares_list_at_once(listed):
    """torch's exit operation takes a node out of the round's participants only: a spare (or a node queued for
    the next round) that leaves would stay listed until its keep-alive expires, and hold up the next round's
    early close (torch_internals.may_close). ``leave`` takes it out of those lists too."""
    store = HashStore()
    act = dynamic_rendezvous._Action
    handler = DynamicRendezvousHandler.from_backend("t", store, C10dRendezvousBackend(store, "t"), 1, 2,
                                                    local_addr="t")
    add = act.ADD_TO_WAIT_LIST if listed == "wait_list" else act.ADD_TO_REDUNDANCY_LIST

    def put_there(ctx, _deadline):
        return act.FINISH if ctx.node in getattr(ctx.state, listed) else add

    handler._op_executor.run(put_there, time.monotonic() + 5)

    def listed_now() -> int:
        blob, _token = C10dRendezvousBackend(store, "t").get_state()
        view = torch_internals.decode_state(blob)
        return len(view.waiting if listed == "wait_list" else view.spares)

    assert listed_now() == 1
    assert torch_internals.leave(handler, timeout=5) is None
    assert listed_now() == 0


# ---- a torch without a private part: reported, never hidden ------------------------------------------

@pytest.mark.parametrize("owner, name, lost, why", MISSING, ids=MISSING_IDS)
def test_status_names_what_a_torch_without_a_part_loses(monkeypatch, owner, name, lost, why):
    monkeypatch.delattr(owner, name)
    patches = {p.name: p for p in torch_internals.status()}
    assert {n for n, p in patches.items() if not p.installed} == lost
    for patch in (patches[n] for n in lost):
        assert why in patch.why_not
    line = torch_internals.lost_line(list(patches.values()))
    assert line is not None and line.startswith("torch 2.")
    for patch in (patches[n] for n in lost):
        assert f"{patch.name} not installed ({patch.why_not}): {patch.without}" in line


def test_each_install_reports_a_missing_part_and_patches_nothing(monkeypatch):
    monkeypatch.delattr(dynamic_rendezvous, "get_method_name")
    patch = torch_internals.replace_event_names()
    assert not patch.installed and "get_method_name" in patch.why_not
    assert not hasattr(dynamic_rendezvous, "get_method_name")  # not put there by a half install

    monkeypatch.delattr(dynamic_rendezvous, "_delay")
    patch, wake = joining.install_wake(_handler(), host="127.0.0.1", port=1, prefix="p/")
    assert wake is None and not patch.installed and patch.why_not == "dynamic_rendezvous has no _delay"
    assert not hasattr(dynamic_rendezvous, "_delay")

    handler = _handler()
    executor = handler._op_executor
    monkeypatch.delattr(dynamic_rendezvous, "_RendezvousJoinOp")
    patch = torch_internals.close_joins_early(handler, active=lambda: True)
    assert not patch.installed and "_RendezvousJoinOp" in patch.why_not
    assert handler._op_executor is executor  # torch's own executor, unwrapped

    monkeypatch.delattr(utils, "_matches_machine_hostname")
    made, patch = rdzvstore.create_handler(RendezvousParameters(
        backend="c10d", endpoint=f"127.0.0.1:{free_port()}", run_id="t", min_nodes=1, max_nodes=1))
    assert made is None and not patch.installed and "_matches_machine_hostname" in patch.why_not


def test_a_handler_without_its_parts_is_reported(monkeypatch):
    handler = _handler()
    monkeypatch.delattr(handler, "_store")
    patch, wake = joining.install_wake(handler, host="127.0.0.1", port=1, prefix="p/")
    assert wake is None and patch.why_not == "the handler has no _store"
    assert torch_internals.STATE_READS.check(handler).why_not == "the handler has no _store"
    assert torch_internals.handler_store(handler) is None
    handler = _handler()
    monkeypatch.delattr(handler, "_op_executor")
    assert torch_internals.close_joins_early(handler, active=lambda: True).why_not == "the handler has no _op_executor"
    # said, not swallowed: the caller learns why
    assert torch_internals.leave(handler, timeout=1) == "leave not installed: the handler has no _op_executor"


def test_the_early_close_wrap_is_torchs_join_with_one_more_way_out():
    """torch's real join operation for 1 to 2 nodes, one node there: torch itself waits out its last call
    (30 s); wrapped and active, the join closes the round as soon as ``may_close`` says so."""
    handler, asked = _handler(max_nodes=2), []

    def may_close(state, node, settings) -> bool:
        asked.append(node in state.participants and settings.max_nodes == 2)
        return True

    assert torch_internals.close_joins_early(handler, active=lambda: True, may_close=may_close).installed
    handler._op_executor.run(dynamic_rendezvous._RendezvousJoinOp(), time.monotonic() + 20)
    assert handler._state_holder.state.complete and asked == [True]

    idle = _handler(max_nodes=2)  # not active (this agent's first round): torch's own join, its own timeout
    assert torch_internals.close_joins_early(idle, active=lambda: False, may_close=may_close).installed
    with pytest.raises(RendezvousTimeoutError):
        idle._op_executor.run(dynamic_rendezvous._RendezvousJoinOp(), time.monotonic() + 1.5)
    assert asked == [True]


# ---- where it is said: the agent's start-up, the doctor ----------------------------------------------

def _start_agent(cfg) -> tuple[list[str], dict]:
    """The agent's set-up (run folder, event log, worker group, rendezvous object; no join), torn down."""
    agent = Agent(cfg, environ={})
    said: list[str] = []
    agent.say = said.append  # type: ignore[method-assign]
    wakeup, guard = Wakeup(agent.clock), StoreGuard(lambda *_: None)
    stuck = StuckSignals((), lambda: 0, lambda _signum: None).start()
    try:
        agent.ctx = agent._assemble(wakeup, guard)
    finally:
        agent._teardown(guard, wakeup, {}, stuck)
    assert agent._log is not None
    [start] = [r for r in agent._log.records if r["event"] == "start"]
    return said, start


def test_the_agent_says_nothing_when_every_patch_installs(tmp_path):
    said, start = _start_agent(_config(tmp_path))
    assert not [line for line in said if "not installed" in line], said
    assert start["torch_internals"] == {}


def test_the_agent_says_one_line_at_start_up_when_a_patch_does_not_install(tmp_path, monkeypatch):
    monkeypatch.delattr(dynamic_rendezvous, "_delay")
    monkeypatch.delattr(dynamic_rendezvous, "_RendezvousJoinOp")
    said, start = _start_agent(_config(tmp_path))
    lines = [line for line in said if "not installed" in line]
    assert lines == [f"WARNING: torch {torch_internals.torch_version()}: "
                     f"join_wake not installed (dynamic_rendezvous has no _delay): {torch_internals.JOIN_WAKE.without}; "
                     f"early_close not installed (dynamic_rendezvous has no _RendezvousJoinOp): "
                     f"{torch_internals.EARLY_CLOSE.without}"], said
    assert start["torch_internals"] == {"join_wake": "dynamic_rendezvous has no _delay",
                                        "early_close": "dynamic_rendezvous has no _RendezvousJoinOp"}


def test_a_static_rendezvous_is_not_checked(tmp_path, monkeypatch):
    monkeypatch.delattr(dynamic_rendezvous, "_delay")
    cfg = _config(tmp_path, backend="static")
    assert cfg.rendezvous.backend == "static"
    said, start = _start_agent(cfg)
    assert not [line for line in said if "not installed" in line] and start["torch_internals"] is None


def _doctor(**kw) -> dict:
    ctx = DoctorContext.from_values(env={}, versions=lambda: Versions("2.13.0+cpu", None, "0.4.1", None), **kw)
    others = set(check_ids()) - {"versions.torch_internals"}
    [found] = [r for r in run_checks(ctx, skip=others) if r.id == "versions.torch_internals"]
    return {"severity": found.severity, "saw": found.saw, "fix": found.fix}


def test_doctor_is_ok_when_every_patch_installs():
    found = _doctor()
    assert found["severity"] == "ok", found
    assert found["saw"] == f"torch 2.13.0+cpu: all 7 install ({', '.join(k.name for k in torch_internals.PATCHES)})"


def test_doctor_warns_naming_the_patch_that_does_not_install(monkeypatch):
    monkeypatch.delattr(dynamic_rendezvous, "_RendezvousExitOp")
    found = _doctor()
    assert found["severity"] == "warn", found
    assert found["saw"] == (f"torch 2.13.0+cpu: leave not installed (dynamic_rendezvous has no _RendezvousExitOp): "
                            f"{torch_internals.LEAVE.without}")
    assert found["fix"]
    assert _doctor(rdzv_backend="static")["severity"] == "skip"
