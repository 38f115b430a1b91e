"""Did a rank die of a collective timeout? Then it was waiting for someone, and is not the culprit.

When a script has no heartbeats, the first sign of a hang is the process group's own timeout: the ranks
that wait in the collective raise (gloo) or abort (the NCCL watchdog) after ``timeout``, while the rank they
waited for is alive somewhere else. Blaming the rank that timed out restarts or excludes the wrong one
(pytorch#122694), so such an exit opens the hang inquiry instead. Pure: lines in, the matching line out.
"""

from __future__ import annotations

import re
from typing import Sequence

# The messages torch prints when a collective times out (torch 2.3-2.13): gloo's transport, the NCCL
# watchdog, and the DistBackendError wrapper around either.
_PATTERNS = re.compile(
    r"Timed out waiting \d+ ?ms for (?:recv|send) operation"
    r"|Watchdog caught collective operation timeout"
    r"|ran for \d+ milliseconds before timing out"
    r"|DistBackendError.*[Tt]imed? ?out")


def collective_timeout(lines: Sequence[str], signal: str | None = None) -> str | None:
    """The line that says a collective timed out, from a dead worker's last lines (latest first). None for a
    rank SIGKILLed from outside: a timeout raises (gloo) or aborts (NCCL), so its line is from an earlier
    timeout the rank survived (an NVRx in-process restart logs the one it recovered from)."""
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
