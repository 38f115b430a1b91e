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

from mbr_launch.cluster.jobstore import NO_RESTART_KEY, TRACKING_KEY, JobStore, progress_claim_key


class ProgressRecords:
    """The record's keys among the job's keys (``Rendezvous.job_store``: sealed under their own names)."""

    def __init__(self, job: JobStore) -> None:
        self._job = job

    def tracking(self) -> bytes | None:
        """The record (opened: verified with a secret); None when there is none or it was refused."""
        return self._job.read_if_set(TRACKING_KEY)

    def claim(self, token: str, verdict: str) -> tuple[bool, bytes]:
        """(whether this call claimed the round's verdict, the claimed verdict; empty when refused)."""
        first, stands = self._job.claim(progress_claim_key(token), verdict)
        return first, stands or b""

    def save(self, tracking: str) -> None:
        self._job.put(TRACKING_KEY, tracking)

    def no_restart(self, payload: str) -> None:
        self._job.put(NO_RESTART_KEY, payload)


__all__ = ["NO_RESTART_KEY", "ProgressRecords", "TRACKING_KEY"]
