"""The restart policy as a pure function: failure facts in, a decision out."""

from __future__ import annotations

import pytest

from mbr_launch.decide.causes import Cause
from mbr_launch.decide.policy import (Action, FailureFacts, RestartPolicy, backoff_delay, decide,
                               Kept, quick_failure, restart_possible, tolerated)


def test_job_scope_restart_within_budget():
    d = decide(RestartPolicy(max_restarts=2), FailureFacts(cause=Cause.CRASH, exit_code=1, restarts_used=1))
    assert (d.action, d.scope) == (Action.RESTART, "job")


def test_budget_exhausted_stops():
    d = decide(RestartPolicy(max_restarts=2), FailureFacts(cause=Cause.CRASH, exit_code=1, restarts_used=2))
    assert d.action is Action.STOP and "budget exhausted" in d.reason


@pytest.mark.parametrize("code,action", [(17, Action.STOP), (2, Action.STOP), (16, Action.RESTART), (1, Action.RESTART)])
def test_no_restart_exit_codes(code, action):
    d = decide(RestartPolicy(max_restarts=5), FailureFacts(cause=Cause.CRASH, exit_code=code))
    assert d.action is action


@pytest.mark.parametrize("scope", ["node", "rank"])
def test_local_scopes_apply_to_crashes_and_hangs_only(scope):
    policy = RestartPolicy(scope=scope, max_restarts=3)
    assert decide(policy, FailureFacts(cause=Cause.CRASH, exit_code=1)).scope == scope
    assert decide(policy, FailureFacts(cause=Cause.HANG)).scope == scope
    assert decide(policy, FailureFacts(cause=Cause.PEER)).scope == "job"
    assert decide(policy, FailureFacts(cause=Cause.MONITOR)).scope == "job"


def test_startup_failures_have_their_own_budget():
    policy = RestartPolicy(max_restarts=1, max_startup_restarts=3)
    d = decide(policy, FailureFacts(cause=Cause.CRASH, startup=True, restarts_used=1, startup_restarts_used=2))
    assert d.action is Action.RESTART and d.counts_as_startup
    d = decide(policy, FailureFacts(cause=Cause.CRASH, startup=True, startup_restarts_used=3))
    assert d.action is Action.STOP and "startup" in d.reason
    # later failures still use the main budget
    d = decide(policy, FailureFacts(cause=Cause.CRASH, startup=False, restarts_used=1, startup_restarts_used=0))
    assert d.action is Action.STOP
    # without a startup budget, startup failures share the main one (torchrun's behaviour)
    d = decide(RestartPolicy(max_restarts=1), FailureFacts(cause=Cause.CRASH, startup=True, restarts_used=1))
    assert d.action is Action.STOP and not d.counts_as_startup


def test_exclusion_after_k_failures_needs_min_nodes():
    policy = RestartPolicy(max_restarts=9, max_node_failures=2, min_nodes=2)
    assert decide(policy, FailureFacts(cause=Cause.CRASH, node_failures=1, nodes_left=2)).action is Action.RESTART
    assert decide(policy, FailureFacts(cause=Cause.CRASH, node_failures=2, nodes_left=2)).action is Action.EXCLUDE_NODE
    # No node would take its place: it stays, and the job restarts while the budget lasts (ending it would
    # waste the budget the user gave; a spare still starting up is not counted yet)
    d = decide(policy, FailureFacts(cause=Cause.CRASH, node_failures=2, nodes_left=1, restarts_used=8))
    assert (d.action, d.scope, d.kept) == (Action.RESTART, "job", Kept.LAST_NODES), d
    assert "not excluded although this node failed 2 times" in d.reason and "at least 2" in d.reason
    d = decide(policy, FailureFacts(cause=Cause.CRASH, node_failures=2, nodes_left=1, restarts_used=9))
    assert (d.action, d.kept) == (Action.STOP, Kept.LAST_NODES) and "restart budget exhausted" in d.reason


def test_worker_requests():
    policy = RestartPolicy(max_restarts=9, min_nodes=1)
    assert decide(policy, FailureFacts(cause=Cause.REQUEST, exclude_requested=True, nodes_left=1)).action is Action.EXCLUDE_NODE
    assert decide(policy, FailureFacts(cause=Cause.REQUEST, shutdown_requested=True)).action is Action.STOP


def test_backoff_only_in_a_crash_loop():
    policy = RestartPolicy(backoff=1.0, backoff_max=5.0, crash_loop_window=30)
    young = dict(cause=Cause.CRASH, startup=True, round_seconds=2)  # died before any heartbeat, 2 s in
    assert backoff_delay(policy, FailureFacts(**young, quick_failures=0)) == 0
    assert [backoff_delay(policy, FailureFacts(**young, quick_failures=k))
            for k in (1, 2, 3, 4, 5)] == [1, 2, 4, 5, 5]
    assert backoff_delay(policy, FailureFacts(cause=Cause.CRASH, startup=True, round_seconds=60, quick_failures=4)) == 0


def test_a_round_that_stepped_is_not_a_crash_loop_however_short():
    policy = RestartPolicy(backoff=1.0, crash_loop_window=30)
    stepped = FailureFacts(cause=Cause.CRASH, startup=False, round_seconds=2, quick_failures=3)
    assert not quick_failure(policy, stepped)
    assert backoff_delay(policy, stepped) == 0
    assert quick_failure(policy, FailureFacts(cause=Cause.CRASH, startup=True, round_seconds=29.9))
    assert not quick_failure(policy, FailureFacts(cause=Cause.CRASH, startup=True, round_seconds=30))


def test_lost_peer_restarts_only_while_min_nodes_remain():
    policy = RestartPolicy(max_restarts=3, min_nodes=2)
    assert decide(policy, FailureFacts(cause=Cause.PEER, nodes_remaining=2)).action is Action.RESTART
    d = decide(policy, FailureFacts(cause=Cause.PEER, nodes_remaining=1))
    assert d.action is Action.STOP and "only 1 node(s) remain" in d.reason


def test_the_store_host_is_restarted_not_excluded_while_the_budget_lasts():
    policy = RestartPolicy(max_restarts=3, max_node_failures=1, min_nodes=1)
    d = decide(policy, FailureFacts(cause=Cause.CRASH, nodes_left=2, hosts_store=True, restarts_used=1))
    assert (d.action, d.scope, d.kept) == (Action.RESTART, "job", Kept.STORE), d
    assert "not excluded although this node failed 1 times" in d.reason
    d = decide(policy, FailureFacts(cause=Cause.CRASH, nodes_left=2, hosts_store=True, restarts_used=3))
    assert (d.action, d.kept) == (Action.STOP, Kept.STORE) and "restart budget exhausted" in d.reason
    # below its threshold a store host is restarted like any node, with nothing turned down
    d = decide(RestartPolicy(max_restarts=3, max_node_failures=2), FailureFacts(cause=Cause.CRASH, hosts_store=True))
    assert (d.action, d.kept) == (Action.RESTART, None)


MIN_HEALTHY = RestartPolicy(max_restarts=2, min_nodes=2, when="min-healthy", max_node_failures=1)


def test_min_healthy_leaves_a_crashed_rank_lost_while_min_nodes_are_healthy():
    d = decide(MIN_HEALTHY, FailureFacts(cause=Cause.CRASH, exit_code=None, healthy_nodes=2, node_failures=5))
    assert d.action is Action.CONTINUE and "2 node(s) still have every rank alive" in d.reason
    assert tolerated(MIN_HEALTHY, FailureFacts(cause=Cause.CRASH, healthy_nodes=3))


def test_min_healthy_restarts_the_job_when_healthy_nodes_fall_below_min():
    d = decide(MIN_HEALTHY, FailureFacts(cause=Cause.CRASH, healthy_nodes=1, node_failures=0))
    assert (d.action, d.scope) == (Action.RESTART, "job")
    assert d.reason == "only 1 node(s) still have every rank alive and --nnodes needs 2"
    assert decide(MIN_HEALTHY, FailureFacts(cause=Cause.CRASH, healthy_nodes=0, restarts_used=2)).action is Action.STOP


@pytest.mark.parametrize("cause", [Cause.HANG, Cause.PEER, Cause.MONITOR])
def test_min_healthy_tolerates_only_crashes(cause):
    """A hang, a lost peer, a lost monitor restart the job as under any-failed, however many nodes are healthy."""
    facts = FailureFacts(cause=cause, healthy_nodes=3, nodes_remaining=3, node_failures=0)
    assert not tolerated(MIN_HEALTHY, facts)
    assert decide(MIN_HEALTHY, facts).action is Action.RESTART


def test_min_healthy_still_ends_the_job_on_a_no_restart_exit_code_or_a_shutdown_request():
    assert decide(MIN_HEALTHY, FailureFacts(cause=Cause.CRASH, exit_code=2, healthy_nodes=3)).action is Action.STOP
    d = decide(MIN_HEALTHY, FailureFacts(cause=Cause.CRASH, healthy_nodes=3, shutdown_requested=True))
    assert d.action is Action.STOP


def test_any_failed_ignores_node_health():
    d = decide(RestartPolicy(max_restarts=2, min_nodes=2), FailureFacts(cause=Cause.CRASH, healthy_nodes=3))
    assert (d.action, d.reason) == (Action.RESTART, "restarting")


def test_a_restart_is_possible_while_the_budget_lasts_or_nodes_may_join():
    policy = RestartPolicy(max_restarts=2)
    assert restart_possible(policy, restarts_used=1, elastic=False)
    assert not restart_possible(policy, restarts_used=2, elastic=False)
    assert restart_possible(policy, restarts_used=2, elastic=True)  # a node that joins re-forms the round
    assert not restart_possible(RestartPolicy(), restarts_used=0, elastic=False)  # torchrun's default
    assert restart_possible(RestartPolicy(max_startup_restarts=1), restarts_used=0, elastic=False)
    assert not restart_possible(RestartPolicy(max_startup_restarts=0), restarts_used=0, elastic=False)
