"""The restart policy: failure facts in, one decision out. Pure: no IO, no clocks, no store.

``Scope`` is what a restart restarts, ``When`` which failures restart. Budgets are job-wide (counted in the
rendezvous store): failures before any local rank showed a sign of progress ("startup") count against
``max_startup_restarts`` when set, else ``max_restarts``. Some exit codes are never restarted. A node whose
ranks failed ``max_node_failures`` times, or whose worker asked, is excluded while MIN nodes remain; the
exclusion is turned down (``Kept``: the job restarts with the node while the budget lasts) when its exit would
end the job: it serves the store, or no node would take its place (a spare still starting is not counted).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from mbr_launch.decide.causes import Cause


class Action(enum.Enum):
    RESTART = "restart"  # restart at the decision's scope
    EXCLUDE_NODE = "exclude_node"  # this node leaves; the others re-rendezvous without it
    STOP = "stop"  # end the job
    CONTINUE = "continue"  # min-healthy: the rank is lost, everyone else goes on


class _Spelled(str, enum.Enum):
    """A command-line choice as a value: equal to, printed as and logged as its flag's text."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class Scope(_Spelled):
    """What a restart restarts (``--restart-scope``)."""

    JOB = "job"  # every rank of every node; a new rendezvous round (torchrun's semantics)
    NODE = "node"  # this node's ranks, in the round that goes on (workloads that recover in process: torchft)
    RANK = "rank"  # the failed ranks' processes only


class When(_Spelled):
    """Which failures restart (``--restart-policy``, ft_launcher's ``--ft-restart-policy``)."""

    ANY_FAILED = "any-failed"  # any failure restarts at the policy's scope (torchrun's semantics)
    # A crashed rank is lost, not restarted: the job restarts when fewer than MIN nodes are whole.
    MIN_HEALTHY = "min-healthy"


SCOPES = tuple(s.value for s in Scope)  # the flags' choices, in the settings table
RESTART_POLICIES = tuple(w.value for w in When)


@dataclass(frozen=True)
class RestartPolicy:
    scope: Scope = Scope.JOB
    max_restarts: int = 0
    max_startup_restarts: int | None = None
    no_restart_exit_codes: tuple[int, ...] = (2, 17)
    max_node_failures: int = 0  # 0: never exclude a node for its failures
    backoff: float = 1.0  # first delay of a crash loop (doubles each time)
    backoff_max: float = 30.0
    crash_loop_window: float = 30.0  # a round that fails sooner than this after it started is "quick"
    min_nodes: int = 1
    when: When = When.ANY_FAILED  # --restart-policy

    def __post_init__(self) -> None:
        # The flags' text is accepted (and checked) here too: "rank" is Scope.RANK, "rnak" an error.
        object.__setattr__(self, "scope", Scope(self.scope))
        object.__setattr__(self, "when", When(self.when))

    @property
    def min_healthy(self) -> bool:
        return self.when is When.MIN_HEALTHY


@dataclass(frozen=True)
class FailureFacts:
    cause: Cause
    exit_code: int | None = None
    # No local rank showed a sign of progress yet this round (agent.handlers.note_rank_started).
    startup: bool = False
    round_seconds: float = 0.0  # how long the failed round had run
    restarts_used: int = 0  # job-wide restarts counted so far (before this failure)
    startup_restarts_used: int = 0
    node_failures: int = 1  # this node's failures so far, this one included
    quick_failures: int = 0  # consecutive quick failures before this one (crash loop length)
    exclude_requested: bool = False  # a worker sent NVRx ExcludeThisNode
    shutdown_requested: bool = False  # a worker sent NVRx ShutdownWorkload
    nodes_left: int = 1  # nodes that would remain in the job without this one (spares included)
    nodes_remaining: int = 1  # nodes still alive after this failure, this one included (spares included)
    hosts_store: bool = False  # this node serves the rendezvous store: its exit would end every node
    culprit_known: bool = True  # False: a hang whose culprit the verdict could not name
    healthy_nodes: int | None = None  # min-healthy: nodes of the round with every rank alive, after this failure


class Kept(enum.Enum):
    """Why a node that should leave stays: its exit would end the job rather than shrink it."""
    STORE = "this node hosts the rendezvous store"
    LAST_NODES = "no node would take its place"


@dataclass(frozen=True)
class Decision:
    action: Action
    scope: Scope
    reason: str
    backoff: float = 0.0
    counts_as_startup: bool = False
    kept: Kept | None = None  # why an exclusion was turned down (the node stays)
    exhausted: bool = False  # STOP because the restart budget is spent (progress tracking may still name why)
    # STOP that restarting cannot fix (a no-restart code, a shutdown request): ft_launcher's attribution STOP.
    unfixable: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "scope", Scope(self.scope))


def quick_failure(policy: RestartPolicy, facts: FailureFacts) -> bool:
    """Whether this failure extends a crash loop: the round died within the window *and* before any sign of
    progress. A round that trained was healthy however short (torchrun never backs off)."""
    return facts.startup and facts.round_seconds < policy.crash_loop_window


def backoff_delay(policy: RestartPolicy, facts: FailureFacts) -> float:
    """No delay for an isolated failure; 1, 2, 4, ... seconds (capped) while rounds keep dying young."""
    if not quick_failure(policy, facts) or facts.quick_failures == 0:
        return 0.0
    return min(policy.backoff_max, policy.backoff * 2 ** (facts.quick_failures - 1))


def tolerated(policy: RestartPolicy, facts: FailureFacts) -> bool:
    """min-healthy: a crashed rank is left lost while at least MIN nodes still have every rank alive."""
    return (policy.min_healthy and facts.cause is Cause.CRASH and facts.healthy_nodes is not None
            and facts.healthy_nodes >= policy.min_nodes)


def restart_possible(policy: RestartPolicy, *, restarts_used: int, elastic: bool) -> bool:
    """Whether the job may start another round of workers: restarts left, a start-up budget, or an elastic
    node count (MIN < MAX). When none holds, a replacement standby could never be used."""
    return restarts_used < policy.max_restarts or bool(policy.max_startup_restarts) or elastic


def decide(policy: RestartPolicy, facts: FailureFacts) -> Decision:
    if facts.shutdown_requested:
        why = "a straggler was detected (--stop-on-straggler)" if facts.cause is Cause.STRAGGLER \
            else "a worker asked to shut the workload down"
        return Decision(Action.STOP, Scope.JOB, why, unfixable=facts.cause is not Cause.STRAGGLER)
    if facts.exit_code is not None and facts.exit_code in policy.no_restart_exit_codes:
        return Decision(Action.STOP, Scope.JOB, f"exit code {facts.exit_code} is not restarted "
                                                f"(--no-restart-exit-codes)", unfixable=True)
    if tolerated(policy, facts):
        return Decision(Action.CONTINUE, Scope.RANK, f"{facts.healthy_nodes} node(s) still have every rank alive "
                                                     f"and --nnodes needs {policy.min_nodes}: the other ranks go on")
    exclude_reason = None
    if facts.exclude_requested:
        exclude_reason = "a worker asked to exclude this node"
    elif policy.max_node_failures and facts.node_failures >= policy.max_node_failures:
        exclude_reason = f"this node failed {facts.node_failures} times (--max-node-failures {policy.max_node_failures})"
    if exclude_reason:
        if facts.nodes_left < policy.min_nodes:
            return keep_node(f"{exclude_reason}, but only {facts.nodes_left} node(s) would remain (--nnodes needs "
                             f"at least {policy.min_nodes})", Kept.LAST_NODES, facts, policy)
        if facts.hosts_store:  # leaving would take the rendezvous store, and every other node, down
            return keep_node(exclude_reason, Kept.STORE, facts, policy)
        return Decision(Action.EXCLUDE_NODE, Scope.JOB, exclude_reason)
    if facts.cause is Cause.PEER and facts.nodes_remaining < policy.min_nodes:
        return Decision(Action.STOP, Scope.JOB, f"only {facts.nodes_remaining} node(s) remain and --nnodes needs at "
                                                f"least {policy.min_nodes}")
    startup = facts.startup and policy.max_startup_restarts is not None
    if startup:
        assert policy.max_startup_restarts is not None
        if facts.startup_restarts_used >= policy.max_startup_restarts:
            return Decision(Action.STOP, Scope.JOB,
                            f"startup restart budget exhausted ({policy.max_startup_restarts} allowed before the "
                            f"first sign of progress)", counts_as_startup=True, exhausted=True)
    elif facts.restarts_used >= policy.max_restarts:
        return Decision(Action.STOP, Scope.JOB, f"restart budget exhausted ({policy.max_restarts} restarts allowed)",
                        exhausted=True)
    # Restarting one rank or one node mends only a failure whose culprit is known to be there.
    scope = policy.scope if facts.cause.node_fault and facts.culprit_known else Scope.JOB
    reason = "restarting"
    if policy.min_healthy and facts.healthy_nodes is not None:
        reason = f"only {facts.healthy_nodes} node(s) still have every rank alive and --nnodes needs {policy.min_nodes}"
    return Decision(Action.RESTART, scope, reason, backoff=backoff_delay(policy, facts),
                    counts_as_startup=startup)


def keep_node(exclude_reason: str, kept: Kept, facts: FailureFacts, policy: RestartPolicy) -> Decision:
    """An exclusion turned down: a job-wide restart while the budget lasts, else the end of the job."""
    why = f"not excluded although {exclude_reason}"
    if facts.restarts_used >= policy.max_restarts:
        return Decision(Action.STOP, Scope.JOB, f"{why}; restart budget exhausted ({policy.max_restarts} restarts "
                                                f"allowed)", kept=kept, exhausted=True)
    return Decision(Action.RESTART, Scope.JOB, f"{why}; restarting instead", kept=kept)
