"""Why a round failed: one spelling for the summary, the event log and the policy; and whether a worker's
last lines say its crash was another rank's doing (a collective timeout, a lost peer). Pure.
"""

from __future__ import annotations

import enum
import re
from typing import Sequence


class Cause(enum.Enum):
    CRASH = "crash"  # a worker exited non-zero or by a signal
    HANG = "hang"  # the rank monitor saw a deadline pass
    MONITOR = "monitor"  # the rank monitor process died: hang detection was lost
    PEER = "peer"  # another node's agent went silent
    REQUEST = "request"  # a worker asked (NVRx ShutdownWorkload / ExcludeThisNode)
    STRAGGLER = "straggler"  # --stop-on-straggler

    @property
    def node_fault(self) -> bool:
        """This node's own ranks crashed or hung: it counts against the node, and a rank or node restart
        can mend it."""
        return self in (Cause.CRASH, Cause.HANG)


# The messages torch prints when a collective times out (torch 2.3-2.13): gloo's transport, the NCCL
# watchdog, and the DistBackendError wrapper around either.
_PATTERNS = re.compile(
    r"Timed out waiting \d+ ?ms for (?:recv|send) operation"
    r"|Watchdog caught collective operation timeout"
    r"|ran for \d+ milliseconds before timing out"
    r"|DistBackendError.*[Tt]imed? ?out")


def collective_timeout(lines: Sequence[str], signal: str | None = None) -> str | None:
    """The line that says a collective timed out: the rank waited for someone and is not the culprit
    (pytorch#122694), so its exit opens the hang inquiry. None for a SIGKILLed rank: a timeout raises or
    aborts, so its line is from one it survived (an NVRx in-process restart)."""
    return None if signal == "SIGKILL" else _last_match(_PATTERNS, lines)


# What a rank prints when the peer it was talking to went away (its crash is a consequence of that peer's).
_PEER_GONE = re.compile(
    r"Connection closed by peer|Connection reset by peer|remote process exited or there was a network error"
    r"|NCCL communicator was aborted|Broken pipe")


def peer_gone(lines: Sequence[str]) -> str | None:
    """The line that says a rank lost its peer in a collective (a crash cascade's consequence)."""
    return _last_match(_PEER_GONE, lines)


def _last_match(pattern: re.Pattern[str], lines: Sequence[str]) -> str | None:
    return next((line.strip() for line in reversed(lines) if pattern.search(line)), None)
