"""A stop signal that reaches one node, and the nodes that go on without it. Pure: counts in, one answer out.

A signal that reached every node of the round stops the job; one that reached fewer stops only those nodes,
which leave while the others go on (``after_departure``: ft_launcher's ``--ft-restart-policy``). ``reach``'s
rules, in order: (1) inside a Slurm step, a signal this node's rank monitor has pending too (``step_wide``,
``monitor.witness``) came from Slurm, which signals the whole step: the job's; (2) every node of the round
recorded a signal (those that left earlier count): the job's; (3) ``window`` seconds passed without that:
only some nodes'. Cases and reasons: docs/slurm.md.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from mbr_launch.decide.policy import RestartPolicy

WINDOW_SHARE = 0.5  # of --peer-timeout: an agent slower to show a sign of life is taken for lost anyway
MIN_WINDOW = 1.0  # seconds: the signal's delivery to every node, and each agent's wake-up, on a loaded machine


def window(peer_timeout: float) -> float:
    return max(MIN_WINDOW, peer_timeout * WINDOW_SHARE)


class Reach(enum.Enum):
    JOB = "job"  # every node of the round: the job stops (exit 5 or 128+N, requeue where asked)
    NODE = "node"  # only some: those nodes leave the job (exit 6), the others go on


def reach(*, nodes: int, signalled: int, waited: float, window: float, step_wide: bool = False) -> Reach | None:
    """``signalled``: the round's nodes stopped by a signal so far, this one and those that left included;
    ``waited``: seconds since this node's signal. None: not known yet (wait and count again)."""
    if step_wide or signalled >= nodes:
        return Reach.JOB
    return Reach.NODE if waited >= window else None


class Next(enum.Enum):
    """What the round does after a node left it."""

    GO_ON = "go on"  # the other nodes' workers go on, nothing restarts
    REFORM = "re-form"  # nodes wait to join: the round re-forms with them (no restart spent)
    RESTART = "restart"  # the job restarts (one of --max-restarts)
    STOP = "stop"  # the job ends (exit 1 on every node that is left)


@dataclass(frozen=True)
class DepartureFacts:
    nodes: int  # nodes of the round
    left: int  # nodes that left it so far, this one included
    unhealthy: int = 0  # min-healthy: nodes of the round without every rank alive (the ones that left among them)
    waiting: int = 0  # nodes waiting to join (the wait list and spares)
    restarts_used: int = 0
    elastic: bool = True  # nodes may join a running job (c10d, not min-healthy): a waiting node re-forms the round


@dataclass(frozen=True)
class AfterDeparture:
    next: Next
    reason: str
    exhausted: bool = False  # STOP because the restart budget is spent


def after_departure(policy: RestartPolicy, facts: DepartureFacts) -> AfterDeparture:
    remaining = facts.nodes - facts.left
    need = policy.min_nodes
    if policy.min_healthy:
        healthy = facts.nodes - facts.unhealthy
        if healthy >= need:
            return AfterDeparture(Next.GO_ON, f"{healthy} node(s) still have every rank alive and --nnodes needs "
                                              f"{need} (--restart-policy min-healthy)")
        why = f"only {healthy} node(s) still have every rank alive and --nnodes needs {need}"
        if facts.restarts_used >= policy.max_restarts:
            return AfterDeparture(Next.STOP, f"{why}; restart budget exhausted ({policy.max_restarts} restarts "
                                             "allowed)", exhausted=True)
        return AfterDeparture(Next.RESTART, f"{why}: restarting")
    if facts.waiting > 0 and facts.elastic and remaining + facts.waiting >= need:
        return AfterDeparture(Next.REFORM, f"{facts.waiting} node(s) wait to join: the round re-forms with them")
    if remaining >= need:
        return AfterDeparture(Next.GO_ON, f"the other {remaining} node(s) go on (--nnodes needs {need})")
    return AfterDeparture(Next.STOP, f"only {remaining} node(s) remain and --nnodes needs at least {need}")
