"""Telemetry as a round feature: step deadlines for the rank monitor, goodput segments, the status display and
the straggler check (``agent.telemetry`` keeps the numbers; this says when the round feeds them)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mbr_launch.agent.failures import handle_failure
from mbr_launch.agent.features import Feature
from mbr_launch.agent.messages import Progress, RankStarted, RoundResult
from mbr_launch.agent.telemetry import Telemetry
from mbr_launch.cluster.round import Round
from mbr_launch.decide.causes import Cause
from mbr_launch.report import exitcodes
from mbr_launch.report.summary import FailureRecord

if TYPE_CHECKING:
    from mbr_launch.agent.context import Context


class TelemetryFeature(Feature):
    def __init__(self, telemetry: Telemetry) -> None:
        self.telemetry = telemetry

    def monitor_settings(self) -> dict[str, Any]:
        return self.telemetry.monitor_config()

    def workers_started(self, ctx: Context, rnd: Round, local_ranks: list[int]) -> None:
        self.telemetry.begin(rnd.index, local_ranks)

    def observe(self, ctx: Context, event: RankStarted | Progress) -> None:
        telemetry = self.telemetry
        if isinstance(event, RankStarted):
            if event.first_step is not None:
                telemetry.on_first_step(dict(event.first_step))
        else:
            (telemetry.on_steps if event.kind == "steps" else telemetry.on_status)(dict(event.payload))

    def tick(self, ctx: Context, rnd: Round) -> RoundResult | None:
        """Straggler check, goodput segments, the plain status line, when due; a straggler may stop the job."""
        due = self.telemetry.next_tick()
        if due is None or ctx.clock() < due:
            return None
        report = self.telemetry.tick(rnd.index)
        if report is None or not report.stragglers or not self.telemetry.stop_on_straggler:
            return None
        rank = report.stragglers[0]
        score = report.scores[rank]
        local = next((w.local_rank for w in ctx.group.workers if w.rank == rank), -1)
        record = FailureRecord(round=rnd.index, rank=rank, local_rank=local, node=ctx.node,
                               group_rank=rnd.group_rank, cause=Cause.STRAGGLER, status=None,
                               detail=f"straggler: relative score {score.relative:.2f}, individual "
                                      f"{score.individual:.2f} below {report.threshold:g} (--stop-on-straggler)")
        return handle_failure(ctx, rnd, [record], shutdown=True)

    def detected(self, ctx: Context) -> None:
        self.telemetry.detected()

    def attempt_ended(self, ctx: Context, cause: str, detail: str = "") -> None:
        self.telemetry.end(cause, detail)

    def job_ends(self, ctx: Context, code: int) -> None:
        self.telemetry.end("end" if code == exitcodes.OK else "stop")
        self.telemetry.close()
