"""The restart policy's scope and when are enums spelled as their flags: the text that is parsed, printed and
written to the event log stays the same. Pure: no process."""

from __future__ import annotations

import json

import pytest

from mbr_launch.config.build import build_config
from mbr_launch.config.errors import ConfigError
from mbr_launch.config.settings import SETTINGS, resolve
from mbr_launch.decide.causes import Cause
from mbr_launch.decide.policy import (RESTART_POLICIES, SCOPES, Action, Decision, FailureFacts, RestartPolicy, Scope,
                                      When, decide)

pytestmark = pytest.mark.timeout(30)


def test_the_flags_choices_are_the_enums():
    by_name = {s.name: s for s in SETTINGS}
    assert by_name["restart_scope"].choices == SCOPES == ("job", "node", "rank")
    assert by_name["restart_policy"].choices == RESTART_POLICIES == ("any-failed", "min-healthy")
    assert (by_name["restart_scope"].default, by_name["restart_policy"].default) == ("job", "any-failed")


def test_a_value_reads_and_prints_as_its_text():
    assert Scope("rank") is Scope.RANK and When("min-healthy") is When.MIN_HEALTHY
    assert Scope.JOB == "job" and When.ANY_FAILED == "any-failed"
    assert (str(Scope.NODE), f"{Scope.NODE}", f"{When.MIN_HEALTHY:>12}") == ("node", "node", " min-healthy")
    assert json.dumps({"scope": Scope.RANK}) == '{"scope": "rank"}'


def test_text_is_taken_and_checked_where_a_policy_is_made():
    policy = RestartPolicy(scope="node", when="min-healthy")  # type: ignore[arg-type]
    assert policy.scope is Scope.NODE and policy.when is When.MIN_HEALTHY and policy.min_healthy
    assert Decision(Action.STOP, "job", "why").scope is Scope.JOB  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        RestartPolicy(scope="nodes")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        RestartPolicy(when="min_healthy")  # type: ignore[arg-type]


def test_decisions_carry_enum_scopes():
    assert decide(RestartPolicy(scope=Scope.RANK, max_restarts=1), FailureFacts(cause=Cause.CRASH)).scope is Scope.RANK
    assert decide(RestartPolicy(scope=Scope.RANK, max_restarts=1), FailureFacts(cause=Cause.PEER)).scope is Scope.JOB


def _config(**cli: str):
    # A single node with no port: a private c10d rendezvous, so building asks nothing of the host.
    return build_config(resolve(cli, {}, {}), script=__file__, environ={})


def test_the_launch_config_holds_enums():
    policy = _config(restart_scope="rank").policy
    assert policy.scope is Scope.RANK and policy.when is When.ANY_FAILED
    assert _config(restart_policy="min-healthy").policy.when is When.MIN_HEALTHY
    with pytest.raises(ConfigError, match="--restart-policy min-healthy leaves a crashed rank lost, "
                                          "--restart-scope node restarts it in place"):
        _config(restart_policy="min-healthy", restart_scope="node")
