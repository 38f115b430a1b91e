"""ft_launcher 0.6/0.7's progress tracking and cycle-info files as a round feature (``agent.cycles`` keeps the
records and the rule; this says when the round feeds them)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mbr_launch.agent.cycles import CycleRecords
from mbr_launch.agent.features import Feature
from mbr_launch.agent.messages import Progress, RankStarted, RoundResult
from mbr_launch.cluster.round import Round

if TYPE_CHECKING:
    from mbr_launch.agent.context import Context

# Seconds between the rank monitor's status rows when only progress tracking asks for them (no status display).
PROGRESS_STATUS_INTERVAL = 1.0


class CycleFeature(Feature):
    def __init__(self, records: CycleRecords, *, status_rows: bool) -> None:
        self.records = records
        self._status_rows = status_rows  # the ranks' training iterations come in the monitor's status rows

    def monitor_settings(self) -> dict[str, Any]:
        return {"status_interval": PROGRESS_STATUS_INTERVAL} if self._status_rows else {}

    def closed(self, ctx: Context) -> tuple[int, str] | None:
        return self.records.no_restart_line(ctx.rendezvous.job_get)

    def round_begins(self, ctx: Context, rnd: Round) -> None:
        self.records.begin(rnd)

    def observe(self, ctx: Context, event: RankStarted | Progress) -> None:
        if isinstance(event, Progress):
            self.records.on_progress(event.payload)

    def on_failure(self, ctx: Context, rnd: Round) -> tuple[str, int] | None:
        """Not worth another cycle (no progress in too many): the line and the no-restart exit code."""
        with ctx.store_call("recording the cycle's progress"):
            stuck = self.records.check(rnd)
        return None if stuck is None else (stuck, self.records.exit_code)

    def round_ended(self, ctx: Context, result: RoundResult) -> None:
        self.records.end(membership=result.message is not None and result.message.membership)

    def close(self) -> None:
        self.records.close()
