"""Closing a failure round as soon as every node that announced itself has joined (issue #18).

torch's c10d rendezvous opens a round's "last call" when ``--nnodes MIN`` nodes have joined and then waits
``last_call_timeout`` (30 s by default) for more. At launch that is useful: the job's nodes start at different
times. In a round that follows a failure it is dead time: every node still alive is already in the rendezvous
state (in the wait list, or as a spare), because the new round cannot begin before every participant of the
failed one has left it (or was dropped for a missed keep-alive).

``torch_internals.close_joins_early`` wraps the handler's operation executor so that, in a round this agent
joins after its first, the join closes the round once (``may_close``): it is a participant, at least MIN nodes
are in, nobody is in the wait list or the redundancy list (spares and announced joiners are still waited for),
and ``SETTLE`` seconds have passed since MIN was reached (a spare moves from the redundancy list to the
participants in two writes; the pause covers that gap). Everything else is torch's own join; without torch's
private classes nothing is wrapped, torch's own last call applies, and the record says so.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any, Callable

from mbr_launch.cluster import torch_internals
from mbr_launch.cluster.torch_internals import Patch

SETTLE = 1.0  # seconds after MIN nodes joined before a failure round may close without its last call


def install(handler: Any, *, active: Callable[[], bool]) -> Patch:
    """Wrap ``handler``'s join so that failure rounds close early; ``active()`` is asked at each join (True
    in rounds after this agent's first). The record says whether it took."""
    return torch_internals.close_joins_early(handler, active=active, may_close=may_close)


def may_close(state: Any, node: Any, settings: Any, *, now: datetime | None = None) -> bool:
    """Whether a failure round may be closed now (see the module's docstring)."""
    if state.closed or state.complete or node not in state.participants or state.deadline is None:
        return False
    if not settings.min_nodes <= len(state.participants) <= settings.max_nodes:
        return False
    if state.wait_list or getattr(state, "redundancy_list", ()):
        return False
    now = now or datetime.now(timezone.utc)
    min_reached = state.deadline - settings.timeout.last_call  # torch sets the deadline when MIN joined
    return now >= min_reached + timedelta(seconds=SETTLE)
