"""A stop signal that reaches one node, and the nodes that go on without it. Pure: counts in, one answer out.

Who a stop signal stops (``reach``). A signal (SIGTERM, SIGINT, a ``--preempt-signals`` one, ...) stops the
job when, with it, every node of the round has been stopped by one: Slurm's preemption, ``scancel`` and time
limit signal every task of the step, and a Ctrl-C on a terminal reaches every agent it runs. A signal that
reaches fewer nodes (a ``kill`` of one launcher, a node drained by its scheduler, a pod evicted) stops only
the nodes it reached: each leaves the job, as under torchrun and ft_launcher, and the others go on. The
rules, in order:

1. Inside a Slurm step, a signal that reached every process of this node's part of the step (``step_wide``:
   this node's rank monitor, in a session of its own, got it too: ``monitor.witness``) came from Slurm,
   which signals a step on all its nodes and never on one alone: the job's, known on this node at once,
   however late the other nodes see theirs.
2. Every node of the round has recorded a signal in the round's store (nodes that left the round earlier,
   stopped by their own, count: the signal that stops the last nodes is the job's): the job's.
3. ``window`` seconds have passed since this node's signal without that: only some nodes (this one leaves).

The workers get the signal at once either way: the answer only decides what the node does after its workers
stopped. What the other nodes do when a node leaves (``after_departure``) is what ft_launcher 0.4.1 does
with ``--ft-restart-policy``; a workload whose collectives needed the node that left fails there, and that
failure restarts the job as any does.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from mbr_launch.decide.policy import RestartPolicy

# The share of --peer-timeout within which every node of the round records the same stop for it to be the
# job's: an agent that takes longer to show a sign of life is taken for lost anyway.
WINDOW_SHARE = 0.5
MIN_WINDOW = 1.0  # seconds: the signal's delivery to every node, and each agent's wake-up, on a loaded machine


def window(peer_timeout: float) -> float:
    return max(MIN_WINDOW, peer_timeout * WINDOW_SHARE)


class Reach(enum.Enum):
    """How far a stop signal reached."""

    JOB = "job"  # every node of the round: the job stops (exit 5 or 128+N, requeue where asked)
    NODE = "node"  # only some: those nodes leave the job (exit 6), the others go on


def reach(*, nodes: int, signalled: int, waited: float, window: float, step_wide: bool = False) -> Reach | None:
    """``signalled``: the round's nodes stopped by a signal so far, this one included (those that left the
    round earlier count: they were stopped too); ``waited``: seconds since this node's signal; ``step_wide``:
    Slurm sent it to every process of this node's step. None: not known yet (wait and count again)."""
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
