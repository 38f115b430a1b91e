"""Whether this agent may take the fast path to the next round (``cluster.fastround``) after a job-wide
restart, or must send every agent of the round to the full c10d join."""

from __future__ import annotations

from mbr_launch.agent.context import Context
from mbr_launch.agent.messages import RoundResult
from mbr_launch.cluster.rendezvous import Round
from mbr_launch.decide.causes import Cause


def fast_blocker(ctx: Context, rnd: Round, result: RoundResult) -> str | None:
    """Why the next round must be a full join (membership may change), or None: the same agents go on.
    Every agent of the round decides for itself; one that says no aborts the fast path for all of them."""
    message = result.message
    if message is None:
        return "the round ended without a decision"
    if message.membership:
        return "nodes wait to join"
    if message.exclude:
        return f"node {message.exclude} left the job"
    if any(f.cause is Cause.PEER and f.round == rnd.index for f in ctx.summary.failures):
        return "a node was lost"
    try:
        with ctx.store_call("asking whether nodes wait to join"):
            waiting = ctx.rendezvous.spare_count()
    except Exception as err:  # the join that follows meets the same store and reports it
        return f"could not ask whether nodes wait ({type(err).__name__})"
    return f"{waiting} node(s) wait outside the round" if waiting else None
