"""Closing a failure round as soon as every node that announced itself has joined.

torch's last call (30 s for more nodes once MIN joined) is dead time after a failure: every live node is
already in the rendezvous state. So a join after this agent's first closes the round once ``may_close``:
it is a participant, MIN nodes are in, no one waits or spares, and ``SETTLE`` has passed (a spare's move to
the participants takes two writes).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any, Callable

from mbr_launch.cluster import torch_internals
from mbr_launch.cluster.torch_internals import Patch

SETTLE = 1.0  # seconds after MIN nodes joined before a failure round may close without its last call


def install(handler: Any, *, active: Callable[[], bool]) -> Patch:
    """Wrap ``handler``'s join so that failure rounds close early (``active()``: asked at each join)."""
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
