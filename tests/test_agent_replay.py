"""Scripted histories replayed through the real supervisor loop, handlers, failure path and policy, with fake
workers, rendezvous, store and clock (tests/replay.py): no process is spawned, each test takes milliseconds."""

from __future__ import annotations

import signal

import pytest

from mbr_launch.agent import handlers
from mbr_launch.agent.features.telemetry import TelemetryFeature
from mbr_launch.agent.features.telemetry import Telemetry
from mbr_launch.agent.messages import (Departure, MonitorDied, MonitorWarning, NodesWaiting, PeerStopped, RankExpired,
                                       RankStarted, WorkloadRequest, decode_monitor_event)
from mbr_launch.decide.verdict import ProcState, StackClass
from mbr_launch.cluster.peers import PeerLost
from mbr_launch.cluster.stops import StopMessage
from mbr_launch.report import exitcodes
from tests.replay import (ScriptExhausted, all_exit, build_world, deliver, exit_rank, idle, kill_rank, node_lost,
                          post, silence)

pytestmark = pytest.mark.timeout(20)


def causes(world) -> list[str]:
    return [r["cause"] for r in world.events("failure")]


def test_crash_restarts_the_job_then_succeeds(tmp_path):
    world = build_world(tmp_path, ("max_restarts", 3))
    code = world.run([post(RankStarted(0)), exit_rank(1, code=7), all_exit(0)])
    assert code == exitcodes.OK
    assert causes(world) == ["crash"]
    failure = world.events("failure")[0]
    assert (failure["rank"], failure["exit_code"], failure["startup"]) == (1, 7, False)
    assert [m.reason for m in world.cluster.published] == ["rank 1 (local rank 1) on n0: exit code 7"]
    assert [r["round"] for r in world.events("rendezvous")] == [0, 1]
    assert world.events("restart")[0]["restart_count"] == 1
    assert world.group.starts == [(0, None), (1, None)]
    assert world.events("end")[-1]["exit_code"] == 0
    assert len(world.ctx.summary.failures) == 1


def test_restart_budget_exhausted_ends_the_job(tmp_path):
    world = build_world(tmp_path, ("max_restarts", 1))
    code = world.run([post(RankStarted(0)), exit_rank(0, code=1), post(RankStarted(0)), exit_rank(1, code=1)])
    assert code == exitcodes.FAILED
    assert causes(world) == ["crash", "crash"]
    assert world.cluster.published[-1].final
    assert "restart budget exhausted (1 restarts allowed)" in world.events("end")[-1]["reason"]


def test_no_restart_exit_code_stops_at_once(tmp_path):
    world = build_world(tmp_path, ("max_restarts", 5))
    assert world.run([exit_rank(0, code=2)]) == exitcodes.FAILED
    assert "exit code 2 is not restarted" in world.events("end")[-1]["reason"]
    assert world.rendezvous.joined == 1


@pytest.mark.parametrize(("action", "code"), [("log", exitcodes.FAILED), ("no-restart", 93)])
def test_attribution_stop_action_ends_an_unfixable_failure_with_the_no_restart_code(tmp_path, action, code):
    # ft_launcher 0.7's --ft-attribution-stop-action: a failure restarting cannot fix (here a no-restart exit code)
    # ends every launcher with --ft-no-restart-exit-code under no-restart; under log, with the usual code.
    world = build_world(tmp_path, ("max_restarts", 5), ("attribution_stop_action", action))
    assert world.run([exit_rank(0, code=2)]) == code
    assert world.cluster.published[-1].final and world.cluster.published[-1].exit_code == code
    assert ("not to be requeued" in world.events("end")[-1]["reason"]) == (action == "no-restart")


def test_attribution_stop_action_leaves_restartable_failures_alone(tmp_path):
    world = build_world(tmp_path, ("max_restarts", 1), ("attribution_stop_action", "no-restart"))
    code = world.run([post(RankStarted(0)), exit_rank(0, code=1), post(RankStarted(0)), exit_rank(1, code=1)])
    assert code == exitcodes.FAILED  # the budget ran out: restarting could have fixed it, the job may be requeued


def test_hang_verdict_names_the_rank_outside_the_collective_not_the_first_deadline(tmp_path):
    """Rank 0's deadline fires first (it waits in all_reduce); rank 1 sleeps outside any collective."""
    world = build_world(tmp_path, ("max_restarts", 1), ("hang_kill_grace", 1.5), ("hang_inquiry_timeout", 1.25))
    world.looks[1] = {"stack": StackClass.OUTSIDE, "where": "sleep at train.py:42", "collective": ""}
    waiting = RankExpired(local_rank=0, rank=0, pid=None, kind="section", section="step", timeout=3.0, elapsed=3.2,
                          open_sections=("step",))
    code = world.run([post(RankStarted(0)), post(RankStarted(1)), post(waiting), all_exit(0)])
    assert code == exitcodes.OK
    assert world.gathers == [(0, 1.25)]
    verdict = world.events("verdict")[0]
    assert (verdict["culprits"], verdict["basis"], verdict["nodes"]) == ([1], "stacks", ["n0"])
    assert world.group.stops[0] == {"local_ranks": [1], "signal": "SIGTERM", "grace": 1.5}
    failure = world.events("failure")[0]
    assert (failure["rank"], failure["cause"]) == (1, "hang")
    assert world.ctx.summary.failures[0].stacks == "/stacks/1"
    assert any(line.startswith("HANG: rank 1 on n0 is outside any collective") for line in world.said), world.said
    assert [e["expired"] for e in verdict["evidence"]] == [True, False]  # rank 0's deadline is in its evidence


def test_deadlines_of_the_waiting_ranks_after_a_verdict_open_no_second_inquiry(tmp_path):
    world = build_world(tmp_path, ("max_restarts", 1), ("restart_scope", "rank"))
    world.looks[1] = {"stack": StackClass.OUTSIDE, "where": "busy at train.py:9", "state": ProcState.RUNNING}
    first = RankExpired(local_rank=1, rank=1, pid=None, kind="heartbeat")
    late = RankExpired(local_rank=0, rank=0, pid=None, kind="heartbeat")
    code = world.run([post(RankStarted(0)), post(RankStarted(1)), post(first), post(late), all_exit(0)])
    assert code == exitcodes.OK
    assert len(world.events("verdict")) == 1 and len(world.events("hang")) == 2
    assert [r["rank"] for r in world.events("failure")] == [1]
    assert world.group.starts == [(0, None), (0, [1])]


def test_undetermined_hang_restarts_the_job_and_blames_no_node(tmp_path):
    world = build_world(tmp_path, ("nnodes", "1:2"), ("rdzv_backend", "c10d"), ("rdzv_endpoint", "127.0.0.1:29401"),
                        ("max_restarts", 1), ("max_node_failures", 1), ("restart_scope", "node"), nodes=2)
    code = world.run([post(RankStarted(0)), post(RankExpired(local_rank=0, rank=0, pid=None, kind="heartbeat")),
                      all_exit(0)])
    assert code == exitcodes.OK
    verdict = world.events("verdict")[0]
    assert verdict["culprits"] == [] and verdict["basis"] == "undetermined"
    assert world.events("exclude") == [] and world.rendezvous.node_failures == {}
    assert world.events("restart")[0]["scope"] == "job"
    assert world.group.stops[0]["local_ranks"] is None  # nobody singled out: the whole round stops
    assert any(line.startswith("HANG, culprit undetermined: ") for line in world.said)


def test_culprit_on_another_node_this_node_waits_for_its_stop_message(tmp_path):
    from mbr_launch.decide.verdict import RankEvidence

    world = build_world(tmp_path, ("nnodes", "2"), ("rdzv_backend", "c10d"), ("rdzv_endpoint", "127.0.0.1:29401"),
                        ("max_restarts", 1), nodes=2)
    world.cluster.remote_evidence = [RankEvidence(rank=2, node="n1", group_rank=1, local_rank=0, pid=7,
                                                  state=ProcState.STOPPED, stack=StackClass.NONE)]
    stop = StopMessage(reason="rank 2 hung", origin="n1", group_rank=1, restart_count=1)
    code = world.run([post(RankExpired(local_rank=0, rank=0, pid=None, kind="heartbeat")), idle,
                      exit_rank(1, 1),  # lost its peer in the collective when n1 stopped the culprit
                      post(PeerStopped(stop)), all_exit(0)])
    assert code == exitcodes.OK
    verdict = world.events("verdict")[0]
    assert (verdict["culprits"], verdict["nodes"], verdict["basis"]) == ([2], ["n1"], "stopped")
    assert world.events("failure") == []  # not this node's failure, nor is the consequence
    assert any(line.startswith("rank 1 exited (exit code 1) after the verdict") for line in world.said)
    assert any("rank 2 on n1" in line for line in world.said)


def test_a_culprit_node_that_never_acts_gets_the_job_restarted_from_here(tmp_path):
    from mbr_launch.decide.verdict import RankEvidence

    world = build_world(tmp_path, ("nnodes", "2"), ("rdzv_backend", "c10d"), ("rdzv_endpoint", "127.0.0.1:29401"),
                        ("max_restarts", 1), ("peer_timeout", 4.0), nodes=2)
    world.cluster.remote_evidence = [RankEvidence(rank=2, node="n1", group_rank=1, local_rank=0, pid=7,
                                                  state=ProcState.STOPPED)]

    def finish_in_the_next_round(w):  # until then, time passes and nothing happens
        if w.group.starts[-1][0] == 1:
            all_exit(0)(w)

    code = world.run([post(RankExpired(local_rank=0, rank=0, pid=None, kind="heartbeat")),
                      *[finish_in_the_next_round] * 200])
    assert code == exitcodes.OK  # restarted from here, blaming nobody
    assert [(r["rank"], r["cause"]) for r in world.events("failure")] == [(-1, "hang")]
    assert "did not stop the round" in world.events("failure")[0]["detail"]
    assert world.rendezvous.node_failures == {}


def test_joining_an_inquiry_another_node_opened(tmp_path):
    from mbr_launch.agent.messages import InquiryOpened
    from mbr_launch.cluster.inquiry import Opener
    from mbr_launch.decide.verdict import Basis, Verdict

    world = build_world(tmp_path, ("nnodes", "2"), ("rdzv_backend", "c10d"), ("rdzv_endpoint", "127.0.0.1:29401"),
                        ("max_restarts", 1), nodes=2)
    world.cluster.remote_verdict = Verdict(culprits=(1,), basis=Basis.PROGRESS, reason="rank 1 on n0 is behind")
    code = world.run([post(InquiryOpened(Opener(number=0, group_rank=1, rank=3, kind="step"))), all_exit(0)])
    assert code == exitcodes.OK
    assert world.cluster.evidence[(0, 0)], "this node published its evidence"
    assert world.events("verdict")[0]["decider"] == 1
    assert [r["rank"] for r in world.events("failure")] == [1]
    assert world.cluster.watches[0].inquiries == [0, 1]  # round 0 watched for inquiry 0, then for the next


def test_a_collective_timeout_blames_the_rank_it_waited_for(tmp_path):
    """No heartbeats: rank 0 dies of gloo's timeout while rank 1 sleeps outside any collective."""
    world = build_world(tmp_path, ("max_restarts", 1))
    world.group.lines[0] = ["[rank0]: RuntimeError: [../gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting "
                            "2000ms for recv operation to complete"]
    world.looks[1] = {"stack": StackClass.OUTSIDE, "where": "sleep at train.py:42", "collective": ""}
    assert world.run([post(RankStarted(0)), exit_rank(0, 1), all_exit(0)]) == exitcodes.OK
    verdict = world.events("verdict")[0]
    assert (verdict["culprits"], verdict["waiting"]) == ([1], [0]), verdict
    assert [(r["rank"], r["cause"]) for r in world.events("failure")] == [(1, "hang")]
    assert any("inquiry opened when rank 0 died of a collective timeout" in line for line in world.said)


def test_a_collective_timeout_with_no_culprit_in_sight_is_a_crash(tmp_path):
    world = build_world(tmp_path, ("max_restarts", 1))
    world.group.lines[0] = ["Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE)"]
    assert world.run([exit_rank(0, 1), all_exit(0)]) == exitcodes.OK
    assert [(r["rank"], r["cause"]) for r in world.events("failure")] == [(0, "crash")]


def test_crash_cascade_the_peer_that_lost_its_partner_is_not_the_cause(tmp_path):
    """Rank 0 dies first, of gloo's "Connection closed by peer"; rank 1, the cause, exits 17 a moment later."""
    world = build_world(tmp_path, ("max_restarts", 3))
    world.group.lines[0] = ["RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:1"]
    code = world.run([post(RankStarted(0)), exit_rank(0, 1), exit_rank(1, 17)])
    assert code == exitcodes.FAILED
    assert [(r["rank"], r["exit_code"]) for r in world.events("failure")] == [(1, 17)]
    assert "exit code 17 is not restarted" in world.events("end")[-1]["reason"]
    assert world.rendezvous.joined == 1


def test_crash_cascade_seen_in_one_look_the_cause_decides(tmp_path):
    """Both exits reaped together (the CI race): rank 0 lost its peer, rank 1's 17 must still decide."""
    world = build_world(tmp_path, ("max_restarts", 3))
    world.group.lines[0] = ["RuntimeError: [gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:1"]

    def both(w):
        exit_rank(0, 1)(w)
        exit_rank(1, 17)(w)

    assert world.run([post(RankStarted(0)), both]) == exitcodes.FAILED
    assert [(r["rank"], r["exit_code"]) for r in world.events("failure")] == [(1, 17), (0, 1)]
    assert "exit code 17 is not restarted" in world.events("end")[-1]["reason"]
    assert world.rendezvous.joined == 1


def test_a_verdict_for_a_rank_already_gone_is_ignored(tmp_path):
    world = build_world(tmp_path)
    late = RankExpired(local_rank=0, rank=0, pid=None, kind="heartbeat")

    def exit_then_verdict(w):
        exit_rank(0, 0)(w)
        post(late)(w)

    assert world.run([exit_then_verdict, exit_rank(1, 0)]) == exitcodes.OK
    assert world.events("hang") == [] and world.gathers == []


def test_lost_peer_below_min_nodes_ends_the_job(tmp_path):
    world = build_world(tmp_path, ("nnodes", "2"), ("rdzv_backend", "c10d"), ("rdzv_endpoint", "127.0.0.1:29401"),
                        ("max_restarts", 3), nodes=2)
    code = world.run([post(PeerLost(group_rank=1, silent_for=15.2))])
    assert code == exitcodes.FAILED
    assert causes(world) == ["peer"]
    assert "only 1 node(s) remain and --nnodes needs at least 2" in world.events("end")[-1]["reason"]


def test_lost_peer_with_a_spare_restarts_the_job(tmp_path):
    world = build_world(tmp_path, ("nnodes", "2"), ("rdzv_backend", "c10d"), ("rdzv_endpoint", "127.0.0.1:29401"),
                        ("max_restarts", 3), nodes=2, spares=1)
    code = world.run([post(PeerLost(group_rank=1, silent_for=15.2)), all_exit(0)])
    assert code == exitcodes.OK
    assert world.rendezvous.joined == 2


def test_silent_store_is_judged_by_arithmetic_and_ends_with_exit_3(tmp_path):
    world = build_world(tmp_path, ("peer_timeout", 4.0))
    code = world.run([idle, silence(4.5)])
    assert code == exitcodes.RENDEZVOUS
    assert world.ctx.departure is Departure.NONE
    assert "has not answered for 4.5 s" in world.events("end")[-1]["reason"]


def test_preemption_forwards_sigterm_with_the_grace_and_ends_with_exit_5(tmp_path):
    world = build_world(tmp_path, ("preempt_grace", 7.0))
    code = world.run([deliver(signal.SIGUSR1)])
    assert code == exitcodes.PREEMPTED
    assert world.group.stops[0] == {"local_ranks": None, "signal": "SIGTERM", "grace": 7.0}
    assert world.cluster.published[0].final
    assert [r["signal"] for r in world.events("preemption")] == ["SIGUSR1"]


def test_stop_request_signal_ends_with_128_plus_n(tmp_path):
    world = build_world(tmp_path, ("preempt_signals", "SIGUSR1"))
    assert world.run([deliver(signal.SIGTERM)]) == 128 + signal.SIGTERM
    assert world.group.stops[0]["signal"] == "SIGTERM"


@pytest.mark.parametrize("signum,code", [(signal.SIGTERM, exitcodes.PREEMPTED), (signal.SIGINT, 128 + signal.SIGINT)])
def test_signal_while_waiting_in_the_rendezvous_ends_the_run_at_once(tmp_path, signum, code):
    """torch's rendezvous blocks the main thread until the other nodes come (join_timeout, 600 s by default):
    a signal handled there (here: while next_round blocks) must cut it short, be recorded, and end the run."""
    world = build_world(tmp_path)
    blocked = world.rendezvous.next_round

    def next_round(*_args):
        world.wakeup.post_signal(signum)  # what the agent's signal handler does, in the blocked main thread
        return blocked()

    world.rendezvous.next_round = next_round
    assert world.run([]) == code
    assert world.rendezvous.joined == 0 and world.group.starts == []
    assert [r["signal"] for r in world.events("signal")] == [signum.name]
    assert world.events("end")[-1]["exit_code"] == code
    if signum == signal.SIGTERM:
        assert [r["signal"] for r in world.events("preemption")] == ["SIGTERM"]


def test_membership_change_restarts_without_spending_the_budget(tmp_path):
    world = build_world(tmp_path, ("nnodes", "1:2"), ("rdzv_backend", "c10d"), ("rdzv_endpoint", "127.0.0.1:29401"))
    code = world.run([post(NodesWaiting(1)), all_exit(0)])
    assert code == exitcodes.OK
    assert world.events("failure") == []
    assert world.cluster.published[0].membership and world.rendezvous.restarts == 0
    assert not any(line.startswith("restarting all ranks") for line in world.said)


def test_crash_loop_backs_off_1_then_2_seconds(tmp_path):
    world = build_world(tmp_path, ("max_restarts", 3), ("restart_backoff", 1.0))
    code = world.run([exit_rank(0, 1), exit_rank(0, 1), exit_rank(0, 1), exit_rank(0, 1)])
    assert code == exitcodes.FAILED
    assert [r["backoff"] for r in world.events("restart")] == [0.0, 1.0, 2.0]
    assert world.wakeup.sleeps == [0.0, 1.0, 2.0]
    assert all(r["startup"] for r in world.events("failure"))


def test_a_round_that_trained_does_not_back_off(tmp_path):
    world = build_world(tmp_path, ("max_restarts", 3))
    steps = [post(RankStarted(0)), exit_rank(0, 1)] * 3 + [all_exit(0)]
    assert world.run(steps) == exitcodes.OK
    assert world.wakeup.sleeps == [0.0, 0.0, 0.0]


def test_signal_during_back_off_ends_the_run(tmp_path):
    world = build_world(tmp_path, ("max_restarts", 3), ("restart_backoff", 5.0))

    def crash_and_signal(w):
        exit_rank(0, 1)(w)
        w.wakeup.sleep = lambda seconds: (w.wakeup.post_signal(signal.SIGINT), False)[1]  # type: ignore[method-assign]

    assert world.run([exit_rank(0, 1), crash_and_signal]) == 128 + signal.SIGINT


def test_rank_scope_restarts_only_the_failed_rank_inside_the_round(tmp_path):
    world = build_world(tmp_path, ("max_restarts", 2), ("restart_scope", "rank"))
    code = world.run([post(RankStarted(0)), post(RankStarted(1)), exit_rank(1, 3), all_exit(0)])
    assert code == exitcodes.OK
    assert world.group.starts == [(0, None), (0, [1])]
    assert world.rendezvous.joined == 1
    assert world.events("restart")[0]["scope"] == "rank"


def test_node_failures_exclude_this_node(tmp_path):
    world = build_world(tmp_path, ("nnodes", "1:2"), ("rdzv_backend", "c10d"), ("rdzv_endpoint", "127.0.0.1:29401"),
                        ("max_restarts", 3), ("max_node_failures", 1), nodes=2)
    assert world.run([exit_rank(0, 1)]) == exitcodes.EXCLUDED
    assert world.ctx.departure is Departure.LEAVE
    assert world.cluster.published[0].exclude == "n0"


def test_the_store_host_is_restarted_instead_of_excluded(tmp_path):
    world = build_world(tmp_path, ("nnodes", "1:2"), ("rdzv_backend", "c10d"), ("rdzv_endpoint", "127.0.0.1:29401"),
                        ("max_restarts", 3), ("max_node_failures", 1), nodes=2, hosts_store=True)
    assert world.run([exit_rank(0, 1), all_exit(0)]) == exitcodes.OK
    assert any("hosts the rendezvous store" in line for line in world.said)
    assert world.events("exclude") == []


def test_a_node_nobody_can_replace_is_restarted_instead_of_excluded(tmp_path):
    """2:2 with no spare waiting yet (a spare still starting up is not counted): leaving would end the job, so
    the node stays and the job restarts with it while the budget lasts."""
    world = build_world(tmp_path, ("nnodes", "2:2"), ("rdzv_backend", "c10d"), ("rdzv_endpoint", "127.0.0.1:29401"),
                        ("max_restarts", 3), ("max_node_failures", 1), nodes=2, spares=0)
    assert world.run([exit_rank(0, 1), all_exit(0)]) == exitcodes.OK
    assert any(line.startswith("no node would take its place, so this node stays: not excluded although this "
                               "node failed 1 times") for line in world.said), world.said
    assert world.events("exclude") == [] and len(world.events("restart")) == 1


def test_peer_stop_message_ends_the_job_with_its_code(tmp_path):
    world = build_world(tmp_path, ("nnodes", "2"), ("rdzv_backend", "c10d"), ("rdzv_endpoint", "127.0.0.1:29401"),
                        nodes=2)
    message = StopMessage(reason="rank 3 crashed on n1", origin="n1", group_rank=1, final=True, exit_code=1)
    assert world.run([post(PeerStopped(message))]) == 1
    assert any("stopping local workers: rank 3 crashed on n1 (from n1)" in line for line in world.said)


def test_workload_requests_with_odd_ranks_are_handled(tmp_path):
    world = build_world(tmp_path, ("max_restarts", 3))
    code = world.run([post(WorkloadRequest(rank=None, action="Continue", description="")),
                      post(WorkloadRequest(rank=None, action="ShutdownWorkload", description="done"))])
    assert code == exitcodes.FAILED
    assert causes(world) == ["request"]
    assert "a worker asked to shut the workload down" in world.events("end")[-1]["reason"]


def test_monitor_warnings_are_recorded_warned_about_and_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(handlers, "LOGGED_WARNINGS", 4)
    raw = {"ev": "error", "local_rank": 1, "pid": 4242, "message": "local rank 1: refused a connection from pid 4242"}
    warning = decode_monitor_event(raw)
    assert warning == MonitorWarning(message=raw["message"], local_rank=1, pid=4242)
    world = build_world(tmp_path)
    assert world.run([*[post(warning)] * 7, all_exit(0)]) == exitcodes.OK  # the job goes on
    logged = world.events("monitor_warning")
    assert len(logged) == 4 and logged[-1]["suppressed_after"] == 4
    assert (logged[0]["local_rank"], logged[0]["pid"], logged[0]["round"]) == (1, 4242, 0)
    warned = [line for line in world.said if line.startswith("WARNING: rank monitor: local rank 1: refused")]
    assert len(warned) == handlers.CONSOLE_WARNINGS and "events.jsonl only" in warned[-1]
    assert world.events("failure") == []


def test_lost_monitor_is_restarted_and_the_round_too(tmp_path):
    world = build_world(tmp_path, ("max_restarts", 1))
    assert world.run([post(MonitorDied(exit_code=-9)), all_exit(0)]) == exitcodes.OK
    assert world.monitor.restarts == 1 and causes(world) == ["monitor"]


def test_other_nodes_still_running_keep_this_node_waiting(tmp_path):
    from mbr_launch.agent.messages import AllDone

    world = build_world(tmp_path, nodes=2, all_done=False)
    assert world.run([all_exit(0), idle, post(AllDone())]) == exitcodes.OK
    assert world.cluster.watches[0].all_done_watched
    assert "local workers finished; waiting for the other nodes" in world.said


def test_rendezvous_failure_ends_with_exit_3(tmp_path):
    world = build_world(tmp_path, fail_after=0)
    assert world.run([]) == exitcodes.RENDEZVOUS


def test_a_script_that_runs_out_fails_the_test(tmp_path):
    world = build_world(tmp_path)
    with pytest.raises(ScriptExhausted):
        world.run([idle])


def test_a_sigkilled_rank_whose_log_shows_a_survived_timeout_is_a_crash_not_an_inquiry(tmp_path):
    """NVRx in-process restart logs the gloo timeout it recovered from; a SIGKILL later is no timeout's doing."""
    world = build_world(tmp_path, ("max_restarts", 1))
    world.group.lines[1] = ["rank=1 restart_ex: HealthCheckPassed() <- RuntimeError('[gloo/transport/tcp/"
                            "unbound_buffer.cc:78] Timed out waiting 10000ms for recv operation to complete')"]
    assert world.run([post(RankStarted(0)), kill_rank(1), all_exit(0)]) == exitcodes.OK
    assert world.events("verdict") == []
    failure = world.events("failure")[0]
    assert (failure["rank"], failure["cause"], failure["signal"]) == (1, "crash", "SIGKILL")


# ---- --restart-policy min-healthy: three nodes of two ranks, --nnodes 2:3 (this node is group rank 0) ----------

def _three_nodes(tmp_path, policy: str = "min-healthy"):
    return build_world(tmp_path, ("nnodes", "2:3"), ("rdzv_backend", "c10d"), ("rdzv_endpoint", "127.0.0.1:29401"),
                       ("max_restarts", 2), ("restart_policy", policy), nodes=3)


def test_min_healthy_a_lost_rank_restarts_nothing_while_min_nodes_are_healthy(tmp_path):
    world = _three_nodes(tmp_path)
    code = world.run([post(RankStarted(0)), post(RankStarted(1)), kill_rank(1), idle, exit_rank(0, 0)])
    assert code == exitcodes.OK
    failure = world.events("failure")[0]
    assert (failure["rank"], failure["cause"], failure["signal"]) == (1, "crash", "SIGKILL")
    lost = world.events("rank_lost")[0]
    assert (lost["ranks"], lost["healthy_nodes"], lost["min_nodes"], lost["alive"]) == ([1], 2, 2, [0])
    assert world.events("restart") == [] and world.cluster.published == [] and world.group.stops == []
    assert world.group.starts == [(0, None)]  # nothing restarted: the survivor went on and finished
    assert world.cluster.unhealthy == {0: 1}
    assert any("rank(s) [1] lost, not restarted (--restart-policy min-healthy)" in line for line in world.said)


def test_min_healthy_a_node_is_counted_unhealthy_once_however_many_ranks_it_loses(tmp_path):
    world = _three_nodes(tmp_path)
    code = world.run([post(RankStarted(0)), kill_rank(1), kill_rank(0)])
    assert code == exitcodes.OK  # every local rank lost, the others finish: this node is done, the job too
    assert [r["ranks"] for r in world.events("rank_lost")] == [[1], [0]]
    assert [r["healthy_nodes"] for r in world.events("rank_lost")] == [2, 2]
    assert world.cluster.unhealthy == {0: 1} and world.events("restart") == []


def test_min_healthy_the_death_that_leaves_fewer_than_min_healthy_nodes_restarts_the_job(tmp_path):
    world = _three_nodes(tmp_path)
    code = world.run([post(RankStarted(0)), post(RankStarted(1)), node_lost(0), kill_rank(1), all_exit(0)])
    assert code == exitcodes.OK
    assert world.events("rank_lost") == []
    assert [r["cause"] for r in world.events("failure")] == ["crash"]
    restart = world.events("restart")[0]
    assert (restart["scope"], restart["restart_count"]) == ("job", 1)
    assert world.cluster.published[0].reason.endswith(
        ": SIGKILL; only 1 node(s) still have every rank alive and --nnodes needs 2")  # no guessed sender
    assert world.group.starts == [(0, None), (1, None)]  # the whole job, in a new round
    assert world.cluster.unhealthy[0] == 2 and 1 not in world.cluster.unhealthy  # the new round counts afresh


def test_min_healthy_a_hang_still_restarts_the_job(tmp_path):
    world = _three_nodes(tmp_path)
    world.looks[1] = {"stack": StackClass.OUTSIDE, "where": "sleep at train.py:42", "collective": ""}
    code = world.run([post(RankStarted(0)), post(RankStarted(1)),
                      post(RankExpired(local_rank=0, rank=0, pid=None, kind="heartbeat")), all_exit(0)])
    assert code == exitcodes.OK
    assert world.events("verdict")[0]["culprits"] == [1]
    assert world.events("rank_lost") == [] and world.events("restart")[0]["scope"] == "job"


def test_any_failed_restarts_the_job_at_the_first_lost_rank(tmp_path):
    world = _three_nodes(tmp_path, "any-failed")
    code = world.run([post(RankStarted(0)), post(RankStarted(1)), kill_rank(1), all_exit(0)])
    assert code == exitcodes.OK
    assert world.events("rank_lost") == [] and world.cluster.unhealthy == {}
    assert world.cluster.published[0].reason == "rank 1 (local rank 1) on n0: SIGKILL"
    assert world.group.starts == [(0, None), (1, None)]


def test_a_deadline_passed_during_an_in_process_restart_is_withdrawn_and_the_next_one_is_judged(tmp_path):
    """NVRx in-process restart: rank 0's heartbeat deadline passes while the Wrapper restarts it, and it is back
    with a new client session by the end of the gathering: nothing is stopped, and no quiet time follows, so
    rank 1's deadline, passing later while it sleeps in the script, is judged (and the job restarted)."""
    world = _three_nodes(tmp_path)
    in_wrapper = {"stack": StackClass.RESTARTING, "where": "reentrant_barrier at store.py:295",
                  "collective": "in-process restart"}
    world.looks.update({0: {"watched": True, "stack": StackClass.OUTSIDE, "where": "train at x.py:255"},
                        1: in_wrapper})

    def rank_1_sleeps(w):
        w.looks.update({0: in_wrapper, 1: {"stack": StackClass.OUTSIDE, "where": "sleep at x.py:120"}})
        w.wakeup.post(RankExpired(local_rank=1, rank=1, pid=None, kind="heartbeat"))

    code = world.run([post(RankStarted(0)), post(RankStarted(1)),
                      post(RankExpired(local_rank=0, rank=0, pid=None, kind="heartbeat")), idle, rank_1_sleeps,
                      all_exit(0)])
    assert code == exitcodes.OK
    assert [(v["basis"], v["culprits"]) for v in world.events("verdict")] == [("withdrawn", []), ("stacks", [1])]
    assert [(r["rank"], r["cause"]) for r in world.events("failure")] == [(1, "hang")]
    assert world.group.stops[0]["local_ranks"] == [1] and world.events("restart")[0]["scope"] == "job"
    assert any(line.startswith("no hang: the deadlines passed during an in-process restart (rank 0 initialised its "
                               "client again)") for line in world.said), world.said


def test_a_step_deadline_is_never_withdrawn_by_the_monitor_phase(tmp_path):
    """Autobeat's step deadline leaves the monitor's phase alone (a script without the NVRx client stays
    "armed"): that phase says nothing about a restart, and the sleeping rank is named."""
    world = build_world(tmp_path, ("max_restarts", 1))
    world.looks.update({0: {"watched": True}, 1: {"watched": True, "stack": StackClass.OUTSIDE,
                                                  "where": "sleep at train.py:42", "collective": ""}})
    code = world.run([post(RankStarted(0)), post(RankStarted(1)),
                      post(RankExpired(local_rank=0, rank=0, pid=None, kind="step")), all_exit(0)])
    assert code == exitcodes.OK
    assert [(v["basis"], v["culprits"]) for v in world.events("verdict")] == [("stacks", [1])]
    assert [(r["rank"], r["cause"]) for r in world.events("failure")] == [(1, "hang")]


def test_a_peers_stop_ends_this_nodes_attempt_at_the_stop(tmp_path):
    """Goodput's detection time on a node stopped by a peer runs to the stop, not to the next round's start:
    the attempt's ``progress`` record is written when its workers stop, before the next rendezvous."""
    world = build_world(tmp_path, ("nnodes", "2"), ("rdzv_backend", "c10d"), ("rdzv_endpoint", "127.0.0.1:29401"),
                        ("max_restarts", 1), nodes=2)
    world.ctx.features = [TelemetryFeature(Telemetry(world.ctx.cfg, world.ctx.log, world.said.append, clock=world.clock))]
    stop = StopMessage(reason="rank 2 crashed on n1", origin="n1", group_rank=1, restart_count=1)
    assert world.run([post(PeerStopped(stop)), all_exit(0)]) == exitcodes.OK
    names = [(r["event"], r.get("round")) for r in world.events() if r["event"] in ("progress", "rendezvous")]
    assert names == [("rendezvous", 0), ("progress", 0), ("rendezvous", 1), ("progress", 1)], names
    assert [r["cause"] for r in world.events("progress")] == ["stop", "end"]
