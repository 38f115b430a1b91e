"""The job-wide record of progress across restarts (``decide.noprogress``), kept in the rendezvous store
under the job's keys (``Rendezvous.job_store``: they outlive every round).

Each cycle is scored once for the whole job: the first node to score a round claims its verdict
(``compare_set`` on a key of the round's token, as the first stop message of a round wins), every other node
that scores the same round adopts the claimed one; only the claimer writes the new record. So nodes that fail
at once act on one verdict, and the next round's scorer, whichever node it is, starts from it. A verdict to
stop is also left under ``NO_RESTART_KEY``, where an agent that was waiting outside the round (a spare) reads
why the job ended.
"""

from __future__ import annotations

from typing import Any

from mbr_launch.cluster import storevalue

TRACKING_KEY = "nvrx/progress"
NO_RESTART_KEY = "nvrx/no_restart"


def _claim_key(token: str) -> str:
    return f"nvrx/progress/round/{token}"


class ProgressRecords:
    """The record's keys on one job store (``torch.distributed.Store``)."""

    def __init__(self, job: Any) -> None:
        self._job = job

    def tracking(self) -> bytes | None:
        """The record (opened: verified with a secret); None when there is none or it was refused."""
        if not self._job.check([TRACKING_KEY]):
            return None
        return _opened(TRACKING_KEY, self._job.get(TRACKING_KEY))

    def claim(self, token: str, verdict: str) -> tuple[bool, bytes]:
        """(whether this call claimed the round's verdict, the claimed verdict; empty when refused)."""
        key = _claim_key(token)
        first, stands = storevalue.claim(self._job, key, key, verdict)
        return first, stands or b""

    def save(self, tracking: str) -> None:
        self._job.set(TRACKING_KEY, storevalue.seal(TRACKING_KEY, tracking))

    def no_restart(self, payload: str) -> None:
        self._job.set(NO_RESTART_KEY, storevalue.seal(NO_RESTART_KEY, payload))


def _opened(key: str, raw: bytes) -> bytes | None:
    try:
        return storevalue.open_value(key, raw)
    except storevalue.RefusedValue:
        return None


__all__ = ["NO_RESTART_KEY", "ProgressRecords", "TRACKING_KEY"]
