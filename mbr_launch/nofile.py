"""The launcher's own open-files limit, raised toward the hard one at start-up (reported in the ``start`` event).

The rendezvous store's host holds about four descriptors per agent, so a soft limit of 1024 would run out
at about 220 nodes; the workers inherit the raised limit. doctor's ``limits.nofile`` covers a low hard limit.
"""

from __future__ import annotations

import resource
from typing import Optional

WANTED = 65536  # what doctor's limits.nofile asks for; no higher (code that closes every fd up to it)

# (soft before, soft after) when this process raised its soft limit; None when it did not.
raised: Optional[tuple[int, int]] = None


def raise_soft() -> Optional[tuple[int, int]]:
    """Raise the soft RLIMIT_NOFILE toward the hard one (at most ``WANTED``); returns and keeps what changed."""
    global raised
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    ceiling = WANTED if hard == resource.RLIM_INFINITY else min(hard, WANTED)
    if soft != resource.RLIM_INFINITY and soft < ceiling:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (ceiling, hard))
            raised = (soft, ceiling)
        except (ValueError, OSError):
            pass  # a sandbox that refuses: the check reports the limit as it is
    return raised
