"""The workers' store of one round, served by group rank 0's agent on the round's fresh MASTER_PORT.

When global rank 0 serves it itself (``TORCHELASTIC_USE_AGENT_STORE=False``), every other rank that starts
first meets a closed port, and torch's store client then backs off for about a second before it tries again
(measured: 0.75 s for a server 50 ms late; 2.4 s under load). Warm standbys start every rank within
milliseconds, so that back-off was most of a restart. torchrun avoids it by handing the workers its own
rendezvous store, which outlives rounds and breaks restarts (pytorch#135712). Here the agent starts a new,
empty store for every round before it starts the workers (``TORCHELASTIC_USE_AGENT_STORE=True``: every rank
is a client), and drops it when the next round begins: no key of an earlier round can be read.
"""

from __future__ import annotations

import datetime
from typing import Any


def serve(master_addr: str, port: int, *, timeout: float = 300.0) -> Any | None:
    """A listening store on ``port``, or None when it cannot bind (global rank 0 then serves it, as before)."""
    try:
        from torch.distributed import TCPStore

        return TCPStore(master_addr or "localhost", port, is_master=True, wait_for_workers=False,
                        timeout=datetime.timedelta(seconds=timeout))
    except Exception:
        return None
