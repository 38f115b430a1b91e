"""The launcher's own open-files limit, raised toward the hard one at start-up, and what was done, for the run's
``start`` event.

Many hosts keep a soft limit of 1024 under a far higher hard one. The rendezvous store's host holds about four
descriptors per agent (torchrun's about one: each of our agents keeps a store connection per thread that must
not wait behind another's call), so at 1024 a job of about 220 nodes would run it out where torchrun's would
not. Servers raise their own soft limit for this; so does a launch. The workers inherit it (torchrun's would get
1024; a DataLoader sharing tensors needs more). Where the hard limit is too low, doctor's ``limits.nofile`` says
so and what to do.
"""

from __future__ import annotations

import resource
from typing import Optional

WANTED = 65536  # what doctor's limits.nofile asks for; no higher (code that closes every fd up to it)

# (soft before, soft after) when this process raised its soft limit; None when it did not (already high
# enough, or the system refused).
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
