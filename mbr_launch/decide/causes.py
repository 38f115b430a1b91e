"""Why a round failed: one spelling for the summary, the event log and the policy."""

from __future__ import annotations

import enum


class Cause(enum.Enum):
    CRASH = "crash"  # a worker exited non-zero or by a signal
    HANG = "hang"  # the rank monitor saw a deadline pass
    MONITOR = "monitor"  # the rank monitor process died: hang detection was lost
    PEER = "peer"  # another node's agent went silent
    REQUEST = "request"  # a worker asked (NVRx ShutdownWorkload / ExcludeThisNode)
    STRAGGLER = "straggler"  # --stop-on-straggler

    @property
    def node_fault(self) -> bool:
        """This node's own ranks crashed or hung: it counts against the node (--max-node-failures), and
        restarting one rank or one node can mend it (a dead peer or a lost monitor cannot)."""
        return self in (Cause.CRASH, Cause.HANG)
