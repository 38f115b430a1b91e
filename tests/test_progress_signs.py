"""Signs of progress beyond optimizer steps and NVRx heartbeats (a checkpoint saved, enough collectives, an
advancing NVRx iteration): the monitor's ``first_progress`` event, the agent's ``RankStarted``, and what they
change in the restart policy (no crash-loop back-off, no start-up budget) and in goodput (DCP checkpoints, NVRx's asynchronous and local checkpoints)."""

from __future__ import annotations

import os

import pytest

from mbr_launch.agent.messages import RankExpired, RankStarted, decode_monitor_event
from mbr_launch.contract import BEAT, CHECKPOINT, FIRST, WORK
from mbr_launch.decide.causes import Cause
from mbr_launch.decide.policy import Action, FailureFacts, RestartPolicy, decide, quick_failure
from mbr_launch.monitor.connections import Connections
from mbr_launch.monitor.deadlines import RankWatch, Timeouts
from mbr_launch.monitor.protocol import Heartbeat, SectionClose, SectionOpen
from mbr_launch.monitor.state import Conn, Shared, Slot
from mbr_launch.monitor.wire import MonitorEvent
from mbr_launch.report import exitcodes
from testkit.helpers import SCRIPTS, launcher_env, run_events, run_launcher
from testkit.nvrx_versions import nvrx_env
from tests.replay import all_exit, build_world, exit_rank, post

pytestmark = pytest.mark.timeout(60)

SIGNS = ("checkpoint", "collectives", "iteration")


def progress(kind: str, local_rank: int = 0) -> RankStarted:
    """What the agent makes of the monitor's first_progress line."""
    event = decode_monitor_event({"ev": "first_progress", "local_rank": local_rank, "rank": local_rank,
                                  "kind": kind, "t": 4.5, "monotonic": 1234.0})
    assert isinstance(event, RankStarted)
    return event


# ---- the policy -------------------------------------------------------------------------------------------


def test_a_short_round_that_showed_progress_neither_backs_off_nor_spends_the_start_up_budget():
    policy = RestartPolicy(max_restarts=5, max_startup_restarts=1, backoff=5.0, crash_loop_window=30)
    # 15 s rounds after a crash loop of four: with a sign of progress (startup False) this one is no part of it
    trained = FailureFacts(cause=Cause.CRASH, exit_code=-9, startup=False, round_seconds=15, quick_failures=4,
                           startup_restarts_used=1)
    assert not quick_failure(policy, trained)
    d = decide(policy, trained)
    assert d.backoff == 0.0 and not d.counts_as_startup and d.action is Action.RESTART
    # the same round without any sign: a crash loop (back-off) whose start-up budget is spent (stop)
    young = FailureFacts(cause=Cause.CRASH, exit_code=-9, startup=True, round_seconds=15, quick_failures=4)
    assert quick_failure(policy, young) and decide(RestartPolicy(backoff=5.0, max_restarts=5), young).backoff == 30.0
    d = decide(policy, FailureFacts(cause=Cause.CRASH, startup=True, round_seconds=15, startup_restarts_used=1))
    assert d.action is Action.STOP and "first sign of progress" in d.reason


# ---- the agent: decoding, recording, deciding (replayed through the real loop) ----------------------------


def test_the_monitor_events_that_mean_past_start_up():
    assert decode_monitor_event({"ev": "first_heartbeat", "local_rank": 1, "t": 2.0}) == RankStarted(1)
    step = decode_monitor_event({"ev": "first_step", "local_rank": 1, "rank": 3, "t": 2.0, "monotonic": 9.0})
    assert isinstance(step, RankStarted) and step.kind == "step" and step.first_step is not None
    event = progress("collectives", local_rank=1)
    assert (event.local_rank, event.rank, event.kind, event.seconds, event.first_step) == (1, 1, "collectives", 4.5,
                                                                                           None)
    assert decode_monitor_event({"ev": "first_progress", "kind": "checkpoint"}) is None  # no rank: nothing to do


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_nan_or_infinite_number_in_a_monitor_event_reads_as_unknown(bad):
    """The monitor quotes numbers a client sent, and its stream is JSON, which carries NaN and Infinity: a NaN
    compares false with every bound, so it must read as "not said", as a missing field does."""
    started = decode_monitor_event({"ev": "first_progress", "local_rank": 0, "rank": 0, "kind": "iteration", "t": bad})
    assert isinstance(started, RankStarted) and started.seconds is None
    expired = decode_monitor_event({"ev": "expired", "local_rank": 0, "rank": 0, "pid": 7, "kind": "heartbeat",
                                    "timeout": bad, "elapsed": bad, "last_heartbeat_age": bad})
    assert isinstance(expired, RankExpired)
    assert (expired.timeout, expired.elapsed, expired.last_heartbeat_age) == (None, None, None)
    fine = decode_monitor_event({"ev": "expired", "local_rank": 0, "kind": "heartbeat", "timeout": 5, "elapsed": 6.5})
    assert isinstance(fine, RankExpired) and (fine.timeout, fine.elapsed) == (5.0, 6.5)


@pytest.mark.parametrize("kind", SIGNS)
def test_a_round_with_a_sign_of_progress_restarts_without_back_off(tmp_path, kind):
    world = build_world(tmp_path, ("max_restarts", 3), ("restart_backoff", 5.0))
    # a start-up death (quick failure #1), then a round that trained without an optimizer step and died young
    assert world.run([exit_rank(0, 1), post(progress(kind)), exit_rank(1, 1), all_exit(0)]) == exitcodes.OK
    assert [r["backoff"] for r in world.events("restart")] == [0.0, 0.0]
    assert [f["startup"] for f in world.events("failure")] == [True, False]
    (recorded,) = world.events("first_progress")
    assert (recorded["round"], recorded["rank"], recorded["local_rank"], recorded["kind"], recorded["seconds"]) == \
        (1, 0, 0, kind, 4.5)


def test_without_a_sign_the_same_history_backs_off(tmp_path):
    world = build_world(tmp_path, ("max_restarts", 3), ("restart_backoff", 5.0))
    assert world.run([exit_rank(0, 1), exit_rank(1, 1), all_exit(0)]) == exitcodes.OK
    assert [r["backoff"] for r in world.events("restart")] == [0.0, 5.0]
    assert world.events("first_progress") == []


def test_a_sign_of_progress_takes_the_failure_off_the_start_up_budget(tmp_path):
    signs = [exit_rank(0, 1), post(progress("checkpoint")), exit_rank(0, 1), all_exit(0)]
    world = build_world(tmp_path, ("max_restarts", 1), ("max_startup_restarts", 1))
    assert world.run(signs) == exitcodes.OK  # start-up budget for the first, the main one for the second
    assert (world.rendezvous.startup_restarts, world.rendezvous.restarts) == (1, 1)
    (tmp_path / "none").mkdir()
    world = build_world(tmp_path / "none", ("max_restarts", 1), ("max_startup_restarts", 1))
    assert world.run([exit_rank(0, 1), exit_rank(0, 1)]) == exitcodes.FAILED  # two start-up failures: spent


# ---- the monitor: which sign, once per worker --------------------------------------------------------------


@pytest.fixture
def conns():
    events: list[dict] = []
    shared = Shared(events.append, clock=lambda: 10.0)
    connections = Connections(shared)
    slot = Slot(0, RankWatch(Timeouts()))
    slot.rank = 5
    conn = Conn(None, slot)  # type: ignore[arg-type]  # the handlers never touch the socket
    slot.watch.arm(0.0)
    slot.watch.init(0.0, newer=True)
    slot.active = conn
    yield connections, slot, conn, events
    os.close(shared.wake_r)
    os.close(shared.wake_w)


def test_an_advancing_nvrx_iteration_is_a_sign_of_progress(conns):
    connections, slot, conn, events = conns
    connections._on_open(slot, conn, SectionOpen("step", 120))  # resumed at 120: start-up so far
    connections._on_close(slot, conn, SectionClose("step", 120))
    connections._on_open(slot, conn, SectionOpen("checkpoint_load"))
    connections._on_close(slot, conn, SectionClose("checkpoint_load"))  # goodput's checkpoint, no sign
    assert events == [] and slot.steps.progress is None and slot.steps.checkpoint_at == 10.0
    connections._on_open(slot, conn, SectionOpen("step", 121))
    connections._on_close(slot, conn, SectionClose("step", 121))
    connections._on_open(slot, conn, SectionOpen("step", 122))
    assert events == [{"ev": MonitorEvent.FIRST_PROGRESS, "local_rank": 0, "rank": 5, "kind": "iteration",
                       "t": 10.0, "monotonic": 10.0}]
    assert slot.steps.progress == "iteration"


def test_an_nvrx_heartbeat_is_the_first_sign_and_has_its_own_event(conns):
    connections, slot, conn, events = conns
    connections._on_heartbeat(slot, conn, Heartbeat())
    connections._on_open(slot, conn, SectionOpen("step", 1))
    connections._on_close(slot, conn, SectionClose("step", 1))
    connections._on_open(slot, conn, SectionOpen("step", 2))  # advancing, but the agent knows already
    assert [e["ev"] for e in events] == [MonitorEvent.FIRST_HEARTBEAT]  # no first_progress after it
    assert slot.steps.progress == "heartbeat"


@pytest.mark.processes
def test_the_monitor_reports_the_first_mark_of_each_worker_once():
    from tests.test_autobeat import armed_monitor

    steps = {"initial": 30, "subsequent": 30, "report_interval": 0.2, "status_interval": None}
    with armed_monitor(steps, rank=2) as (mon, client):
        client.send(BEAT.pack(0, 0.0, 0.0, WORK))
        first = mon.wait("first_progress")
        assert (first["local_rank"], first["rank"], first["kind"]) == (0, 2, "collectives") and first["t"] >= 0
        client.send(BEAT.pack(0, 0.0, 0.0, CHECKPOINT))
        client.send(BEAT.pack(1, 1.0, 0.5, FIRST))
        assert mon.wait("first_step")["local_rank"] == 0  # still reported: telemetry and goodput need it
        mon.send({"op": "snapshot"})
        row = mon.wait("snapshot")["ranks"][0]
        assert row["progress"] == "collectives" and row["work_at"] is not None and row["checkpoint_at"] is not None
        mon.arm(rank=2)  # a new worker: its first mark is told again
        client.send(BEAT.pack(0, 0.0, 0.0, CHECKPOINT))
        assert mon.wait("first_progress")["kind"] == "checkpoint"
        with pytest.raises(AssertionError):  # one per worker
            client.send(BEAT.pack(0, 0.0, 0.0, WORK))
            mon.wait("first_progress", timeout=1.0)


# ---- real launches ---------------------------------------------------------------------------------------

HANDROLLED = str(SCRIPTS / "handrolled_sgd.py")
# A generous window: on a loaded machine a start-up death can take many seconds, and it must still be quick.
LAUNCH = ["--standalone", "--nproc-per-node", "2", "--restart-backoff", "5", "--crash-loop-window", "120",
          "--status", "off"]


@pytest.mark.processes
@pytest.mark.timeout(240)
def test_a_round_that_trained_without_an_optimizer_restarts_without_back_off(tmp_path):
    # attempt 0 dies at start-up (a quick failure); attempt 1 all-reduces gradients by hand and saves a
    # checkpoint for 3 s, then rank 1 is SIGKILLed: a short round, but it trained, so no back-off
    res = run_launcher([*LAUNCH, "--max-restarts", "2", "--log-dir", str(tmp_path), HANDROLLED,
                        "--plan", "startup,train", "--train-seconds", "3", "--steps", "5",
                        "--save", str(tmp_path / "ckpt.pt")], timeout=220)
    assert res.returncode == 0, res.stderr[-3000:]
    events = run_events(tmp_path)
    assert [e["backoff"] for e in events if e["event"] == "restart"] == [0.0, 0.0]
    assert [(f["round"], f["startup"]) for f in events if f["event"] == "failure"] == [(0, True), (1, False)]
    # both ranks of round 1: 20 collectives after about four steps (rank 0's first save comes at step 10)
    signs = sorted((e["round"], e["rank"], e["kind"]) for e in events if e["event"] == "first_progress")
    assert [s for s in signs if s[0] < 2] == [(1, 0, "collectives"), (1, 1, "collectives")], signs
    assert not [e for e in events if e["event"] == "first_step"]  # no optimizer: the steps saw nothing


@pytest.mark.processes
@pytest.mark.timeout(240)
def test_the_same_script_dying_at_start_up_twice_still_backs_off(tmp_path):
    res = run_launcher([*LAUNCH, "--max-restarts", "2", "--log-dir", str(tmp_path), HANDROLLED,
                        "--plan", "startup,startup", "--steps", "1"], timeout=220)
    assert res.returncode == 0, res.stderr[-3000:]
    events = run_events(tmp_path)
    assert [e["backoff"] for e in events if e["event"] == "restart"] == [0.0, 5.0]
    assert all(f["startup"] for f in events if f["event"] == "failure")


@pytest.mark.processes
@pytest.mark.timeout(240)
def test_distributed_checkpoints_bound_the_lost_work_in_goodput(tmp_path):
    # every rank saves with torch.distributed.checkpoint every 10 steps; rank 1 dies before step 25 once, and
    # the restart resumes from step 20: the failure loses the steps after the last save only
    res = run_launcher(["--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--log-dir", str(tmp_path),
                        "--status", "off", str(SCRIPTS / "plain_sgd.py"), "--steps", "30", "--hidden", "32",
                        "--crash-rank", "1", "--crash-at-step", "25", "--crash-once", "--dcp-every", "10",
                        "--dcp", str(tmp_path / "dcp")], timeout=220)
    _assert_resumed_and_lost_only_since_the_checkpoint(res, tmp_path)


# NVRx 0.7's asynchronous writer sets a CUDA device (its persistent one) or synchronizes CUDA (the forked one):
# on CPU only 0.4.1's runs; on GPUs, 0.7's TorchAsyncCheckpoint and its CUDA-only local state dict.
GPU = pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs CUDA")


@pytest.mark.processes
@pytest.mark.timeout(240)
@pytest.mark.parametrize(("mode", "nvrx", "cuda"), [
    ("async", "0.4.1", False), ("local", "0.7.0", False),
    pytest.param("async", "0.7.0", True, marks=GPU), pytest.param("local", "0.7.0", True, marks=GPU)])
def test_nvrx_checkpoints_bound_the_lost_work_in_goodput(tmp_path, mode, nvrx, cuda):
    # every rank checkpoints through NVRx's own checkpointing every 10 steps (an asynchronous save finalized by
    # its queue, or the local checkpoint manager); rank 1 dies before step 25 once and the restart resumes from
    # step 20: the failure loses the steps after the last finalized checkpoint only
    # both ranks share one GPU when there is one (gloo): the GPU-count check would refuse that
    res = run_launcher(["--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--log-dir", str(tmp_path),
                        "--status", "off", "--skip-check", "gpu.count", str(SCRIPTS / "nvrx_ckpt.py"), "--mode", mode,
                        "--every", "10",
                        "--dir", str(tmp_path / "ckpt"), "--crash-rank", "1", "--crash-at-step", "25",
                        *(["--cuda"] if cuda else [])], timeout=220, env=nvrx_env(nvrx, launcher_env()))
    _assert_resumed_and_lost_only_since_the_checkpoint(res, tmp_path)


def _assert_resumed_and_lost_only_since_the_checkpoint(res, tmp_path) -> None:
    """Rank 1 died before step 25 and the restart resumed from step 20: goodput's lost work is the failed
    attempt's last step minus its last checkpoint, less than the whole attempt."""
    assert res.returncode == 0, res.stderr[-3000:]
    assert "restart 1 training from step 20" in res.stdout
    events = run_events(tmp_path)
    failed = next(e for e in events if e["event"] == "progress" and e["cause"] == "failure")
    assert failed["checkpoint"] is not None and failed["first_step"] < failed["checkpoint"] <= failed["last_step"]
    (good,) = [e for e in events if e["event"] == "goodput"]
    (cost,) = good["failures"]
    assert cost["lost"] == pytest.approx(failed["last_step"] - failed["checkpoint"], abs=0.01), (failed, cost)
    assert cost["lost"] < failed["last_step"] - failed["first_step"]
