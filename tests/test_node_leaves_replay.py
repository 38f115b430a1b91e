"""A stop signal in a job of several nodes, through the real supervisor loop with fakes (tests/replay.py): the
round's count of signalled nodes tells the job's stop from this node's departure, and a departure tells the
others what the policy makes of it (issue #42). The real processes: tests/test_node_leaves.py."""

from __future__ import annotations

import dataclasses
import signal

import pytest

from mbr_launch.cluster.departures import JOB_STOP_KEY
from mbr_launch.cluster.joining import JoinState
from mbr_launch.config.slurm import SlurmEnv
from mbr_launch.decide.leaving import window
from mbr_launch.report import exitcodes

from tests.replay import build_world, deliver, kill_rank

C10D = (("rdzv_backend", "c10d"), ("rdzv_endpoint", "127.0.0.1:29401"))


def _world(tmp_path, *args, nodes=3, **kw):
    return build_world(tmp_path, ("nnodes", "2:3"), ("max_restarts", 2), ("peer_timeout", 6.0), *C10D, *args,
                       nodes=nodes, **kw)


def test_a_signal_every_node_got_stops_the_job_at_once(tmp_path):
    """The two other nodes recorded theirs: this one completes the count, and the job stops as ever (exit 5,
    the final stop for all) without waiting out the window."""
    world = _world(tmp_path)
    world.cluster.signalled[0] = 2
    assert world.run([deliver(signal.SIGTERM)]) == exitcodes.PREEMPTED
    assert world.group.stops[0]["signal"] == "SIGTERM"
    assert [m.final for m in world.cluster.published] == [True]
    assert [(e["reach"], e["signalled"], e["nodes"]) for e in world.events("signal_reach")] == [("job", 3, 3)]
    assert world.wakeup.sleeps == [] and not world.rendezvous.left


def test_a_signal_that_reached_this_node_alone_makes_it_leave_and_the_others_go_on(tmp_path):
    world = _world(tmp_path)
    began = world.clock()
    assert world.run([deliver(signal.SIGTERM)]) == exitcodes.EXCLUDED
    assert world.clock() - began >= window(6.0)  # it waited for the others' signals that long
    assert world.group.stops[0]["signal"] == "SIGTERM"  # its workers got the signal and the grace first
    assert world.rendezvous.left and world.cluster.departed[0] == {0}
    assert world.cluster.published == []  # 2 nodes go on: nothing to tell them but the departure
    assert [(e["next"], e["signal"]) for e in world.events("node_left")] == [("go on", "SIGTERM")]
    end = world.events("end")[-1]
    assert end["exit_code"] == 6 and "the other 2 node(s) go on" in end["reason"]


def test_a_departure_with_a_spare_waiting_re_forms_the_round_without_spending_a_restart(tmp_path):
    world = _world(tmp_path, spares=1)
    assert world.run([deliver(signal.SIGINT)]) == exitcodes.EXCLUDED
    (message,) = world.cluster.published
    assert message.membership and not message.final and "1 node(s) wait to join" in message.reason
    assert world.rendezvous.restarts == 0


def test_a_departure_below_min_nodes_stops_the_job(tmp_path):
    world = build_world(tmp_path, ("nnodes", "3:3"), ("max_restarts", 2), ("peer_timeout", 6.0), *C10D, nodes=3)
    assert world.run([deliver(signal.SIGTERM)]) == exitcodes.EXCLUDED
    (message,) = world.cluster.published
    assert message.final and message.exit_code == exitcodes.FAILED
    assert "only 2 node(s) remain and --nnodes needs at least 3" in message.reason


@pytest.mark.parametrize("others_unhealthy,next_", [(0, "go on"), (1, "restart")])
def test_min_healthy_goes_on_while_min_nodes_are_whole_else_restarts(tmp_path, others_unhealthy, next_):
    world = _world(tmp_path, ("restart_policy", "min-healthy"))
    world.cluster.unhealthy[0] = others_unhealthy
    assert world.run([deliver(signal.SIGTERM)]) == exitcodes.EXCLUDED
    assert [e["next"] for e in world.events("node_left")] == [next_]
    if next_ == "restart":
        (message,) = world.cluster.published
        assert not message.final and not message.membership and message.restart_count == 1
        assert world.rendezvous.restarts == 1
    else:
        assert world.cluster.published == []


def test_the_store_host_cannot_leave_its_signal_ends_the_job_with_exit_3(tmp_path):
    world = _world(tmp_path, hosts_store=True)
    assert world.run([deliver(signal.SIGTERM)]) == exitcodes.RENDEZVOUS
    (message,) = world.cluster.published
    assert message.final and message.exit_code == exitcodes.RENDEZVOUS and "mbr-launch store" in message.reason
    assert not world.rendezvous.left


def _signal_in_join(world, signum=signal.SIGTERM):
    blocked = world.rendezvous.next_round

    def next_round(*_args):
        world.wakeup.post_signal(signum)  # the agent's handler, in the main thread blocked in torch's join
        return blocked()

    world.rendezvous.next_round = next_round


def test_a_spare_signalled_alone_leaves_with_exit_6_and_never_closes_the_rendezvous(tmp_path):
    world = _world(tmp_path)
    world.rendezvous.join_state = JoinState(joined=3, waiting=0, complete=True, spares=1)
    _signal_in_join(world)
    assert world.run([]) == exitcodes.EXCLUDED
    assert world.ctx.departure.value == "leave"
    assert "as a spare" in world.events("end")[-1]["reason"]


def test_a_spare_signalled_with_the_whole_job_ends_as_the_job_does(tmp_path):
    world = _world(tmp_path)
    world.rendezvous.join_state = JoinState(joined=3, waiting=0, complete=True, spares=1)
    world.rendezvous.job_keys[JOB_STOP_KEY] = b"SIGTERM"
    _signal_in_join(world)
    assert world.run([]) == exitcodes.PREEMPTED
    assert world.ctx.departure.value == "leave"


def test_before_the_job_started_a_signal_stops_this_agent_as_before(tmp_path):
    world = _world(tmp_path)
    world.rendezvous.join_state = JoinState(joined=1, waiting=0, complete=False)
    _signal_in_join(world, signal.SIGINT)
    assert world.run([]) == 128 + signal.SIGINT


# ---- inside a Slurm step: the rank monitor is the witness of a signal to the whole step --------------------

STEP = {"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_JOB_NODELIST": "n[1-3]", "SLURM_STEP_NODELIST": "n[1-3]",
        "SLURM_NODEID": "0", "SLURM_PROCID": "0", "SLURM_STEP_TASKS_PER_NODE": "1(x3)"}


def _in_step(world, env=STEP):
    world.ctx.cfg = dataclasses.replace(world.ctx.cfg, slurm=SlurmEnv.from_environ(env))


def test_in_a_slurm_step_a_signal_the_monitor_got_too_is_the_jobs_at_once_however_few_recorded_yet(tmp_path):
    """Slurm signals every process of the step on every node: this node knows the job's stop from its own
    monitor, without waiting for the others' records (a loaded node may record seconds later)."""
    world = _world(tmp_path)
    _in_step(world)
    world.monitor.pending = frozenset({signal.SIGTERM})
    assert world.run([deliver(signal.SIGTERM)]) == exitcodes.PREEMPTED
    assert [(e["reach"], e["by"], e["signalled"]) for e in world.events("signal_reach")] == [("job", "step", 1)]
    assert world.wakeup.sleeps == [] and not world.rendezvous.left and world.cluster.departed == {}


@pytest.mark.parametrize("pending,slurm", [
    (frozenset(), True),  # a `kill` of this launcher alone, inside a step: the monitor did not get it
    (frozenset({signal.SIGUSR1}), True),  # another signal pending there says nothing about this one
    (None, True),  # no monitor (--rank-monitor off): the count alone
    (frozenset({signal.SIGTERM}), False),  # outside Slurm, whatever signalled the monitor is not read
])
def test_without_the_step_wide_witness_a_lone_signal_is_this_nodes(tmp_path, pending, slurm):
    world = _world(tmp_path)
    if slurm:
        _in_step(world)
    world.monitor.pending = pending
    assert world.run([deliver(signal.SIGTERM)]) == exitcodes.EXCLUDED
    assert [(e["reach"], e["by"]) for e in world.events("signal_reach")] == [("node", "window")]


def test_the_witness_is_looked_at_again_while_the_count_waits(tmp_path):
    """The launcher may get Slurm's signal a moment before the monitor does (one kill per process)."""
    world = _world(tmp_path)
    _in_step(world)
    clock = world.clock

    class Late(type(world.monitor)):
        def pending_signals(self):
            return frozenset({signal.SIGTERM}) if clock() - began > 0.6 else frozenset()

    world.ctx.monitor = Late()
    began = clock()
    assert world.run([deliver(signal.SIGTERM)]) == exitcodes.PREEMPTED
    assert [(e["reach"], e["by"]) for e in world.events("signal_reach")] == [("job", "step")]
    assert world.clock() - began < window(6.0)


def test_a_spare_in_a_slurm_step_signalled_with_the_step_ends_as_the_job_does(tmp_path):
    world = _world(tmp_path)
    _in_step(world)
    world.monitor.pending = frozenset({signal.SIGTERM})
    world.rendezvous.join_state = JoinState(joined=3, waiting=0, complete=True, spares=1)
    _signal_in_join(world)
    assert world.run([]) == exitcodes.PREEMPTED


def test_a_signal_and_the_ranks_it_killed_are_the_signal_not_a_crash(tmp_path):
    """Slurm's SIGTERM reaches the ranks too; one without a handler dies of it at once. The agent sees both in
    one wake-up: the signal is recorded first, for the other nodes' count, and the job stops as preempted."""
    world = _world(tmp_path)
    world.cluster.signalled[0] = 2

    def both(w):
        kill_rank(0, signal.SIGTERM)(w)
        deliver(signal.SIGTERM)(w)

    assert world.run([both]) == exitcodes.PREEMPTED
    assert world.events("failure") == [] and world.cluster.published[0].final
