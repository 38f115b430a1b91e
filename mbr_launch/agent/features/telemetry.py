"""Telemetry as a round feature: step beats and status rows in; straggler reports, goodput records (one
``progress`` event per attempt) and the status display's rows out. Fed and ticked by the loop: it never
blocks and starts no thread. ``TelemetryFeature`` says when the round feeds it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, TextIO

from mbr_launch.agent import statusview
from mbr_launch.agent.context import Context, Feature
from mbr_launch.agent.failures import handle_failure
from mbr_launch.agent.messages import Progress, RankStarted, RoundResult
from mbr_launch.cluster.round import Round
from mbr_launch.decide.causes import Cause
from mbr_launch.decide.straggler import Report, StragglerCheck
from mbr_launch.report import exitcodes
from mbr_launch.report.summary import FailureRecord

if TYPE_CHECKING:
    from mbr_launch.config.model import LaunchConfig
    from mbr_launch.report.console import Console
    from mbr_launch.report.events import EventLog

@dataclass
class RoundSteps:
    round: int
    started: float  # monotonic
    first_step: float | None = None
    last_step: float | None = None
    checkpoint: float | None = None
    steps: int = 0
    # The training iterations an NVRx 0.6+ client reported: where the attempt resumed, and how far it got.
    first_iteration: int | None = None
    last_iteration: int | None = None
    detected: float | None = None  # when its failure was detected (a hang: the verdict), before any stop


class Telemetry:
    def __init__(self, cfg: "LaunchConfig", log: "EventLog", say: Callable[[str], None], *,
                 clock: Callable[[], float] = time.monotonic, stream: TextIO | None = None,
                 snapshot: Callable[[], dict[str, Any] | None] | None = None,
                 console: "Console | None" = None) -> None:
        self.log, self.say, self.clock = log, say, clock
        self.snapshot = snapshot  # the monitor's snapshot: the latest steps, not yet reported in a batch
        t = cfg.telemetry
        self.enabled = bool(cfg.monitor.enabled and cfg.workers.use_boot and t.autobeat)
        self.step_timeouts = (t.initial_step_timeout, t.step_timeout)
        self.check = StragglerCheck(interval=t.straggler_interval, threshold=t.straggler_threshold)
        self.stop_on_straggler = t.stop_on_straggler
        self.segment: RoundSteps | None = None
        self.starts: dict[int, int] = {}  # local rank -> times started
        self.rows: dict[int, dict[str, Any]] = {}  # local rank -> last status from the monitor
        self.view = statusview.StatusView(cfg, now=clock(), stream=stream, console=console)

    def monitor_config(self) -> dict[str, Any]:
        initial, subsequent = self.step_timeouts
        return {"initial": initial, "subsequent": subsequent, "report_interval": 1.0,
                "status_interval": self.view.status_interval()}

    def begin(self, round_index: int, local_ranks: list[int]) -> None:
        """Workers (re)started: a new attempt; one still open ends as stopped."""
        now = self.clock()
        if self.segment is not None:
            self.end("stop")
        self.segment = RoundSteps(round=round_index, started=now)
        for lr in local_ranks:
            self.starts[lr] = self.starts.get(lr, 0) + 1
        if self.check.next_due() is not None and not self.check.started:
            self.check.start(now)

    def detected(self) -> None:
        """The attempt's failure was detected now: what follows is restart time, and no later step counts."""
        if self.segment is not None and self.segment.detected is None:
            self._catch_up(self.segment)
            self.segment.detected = self.clock()

    def end(self, cause: str, detail: str = "") -> None:
        seg, self.segment = self.segment, None
        if seg is None:
            return
        ended = self.clock()
        if seg.detected is None:
            self._catch_up(seg)
        detected = seg.detected if seg.detected is not None else ended
        last_step = seg.last_step if seg.last_step is None else min(seg.last_step, detected)
        t = self.log.t_of
        self.log.emit("progress", round=seg.round, started=t(seg.started), ended=t(ended), detected=t(detected),
                      first_step=None if seg.first_step is None else t(seg.first_step),
                      last_step=None if last_step is None else t(last_step),
                      checkpoint=None if seg.checkpoint is None else t(seg.checkpoint), cause=cause,
                      steps=seg.steps, cause_detail=detail or None, first_iteration=seg.first_iteration,
                      last_iteration=seg.last_iteration)

    def _catch_up(self, seg: RoundSteps) -> None:
        """Steps batched in the monitor but not yet reported, and the iterations NVRx clients reported."""
        if self.snapshot is None:
            return
        try:
            snap = self.snapshot() or {}
        except Exception:
            return
        for entry in snap.get("ranks", []):
            first, last = entry.get("first_iteration"), entry.get("iteration")
            if isinstance(first, int) and isinstance(last, int):
                seg.first_iteration = first if seg.first_iteration is None else min(seg.first_iteration, first)
                seg.last_iteration = last if seg.last_iteration is None else max(seg.last_iteration, last)
            if not self.enabled:
                continue
            self._merge(seg, entry.get("first_step_at"), entry.get("last_step_at"), entry.get("checkpoint_at"))
            if entry.get("local_rank") == 0 and entry.get("steps"):
                seg.steps = max(seg.steps, int(entry["steps"]))

    @staticmethod
    def _merge(seg: RoundSteps, first: Any, last: Any, checkpoint: Any) -> None:
        if isinstance(first, (int, float)) and first >= seg.started:
            seg.first_step = first if seg.first_step is None else min(seg.first_step, first)
        if isinstance(last, (int, float)) and last >= seg.started:
            seg.last_step = max(seg.last_step or last, last)
        if isinstance(checkpoint, (int, float)) and checkpoint >= seg.started:
            seg.checkpoint = max(seg.checkpoint or checkpoint, checkpoint)

    def on_first_step(self, event: dict[str, Any]) -> None:
        seg = self.segment
        mono = event.get("monotonic")
        if seg is not None and isinstance(mono, (int, float)):
            seg.first_step = mono if seg.first_step is None else min(seg.first_step, mono)
            seg.last_step = max(seg.last_step or mono, mono)
        if seg is not None:
            self.log.emit("first_step", round=seg.round, rank=event.get("rank"), local_rank=event.get("local_rank"),
                          seconds=event.get("t"))

    def on_steps(self, event: dict[str, Any]) -> None:
        seg = self.segment
        for entry in event.get("ranks", []):
            rank, lr = entry.get("rank"), entry.get("local_rank")
            if isinstance(rank, int):
                self.check.add(rank, entry.get("cpu") or [])
            row = self.rows.setdefault(lr, {"local_rank": lr, "rank": rank})
            if entry.get("periods"):
                row["last_step_time"] = entry["periods"][-1]
            row["step"] = entry.get("index")
            if seg is None:
                continue
            self._merge(seg, entry.get("first"), entry.get("last"), entry.get("checkpoint"))
            if lr == 0 or not seg.steps:
                seg.steps = max(seg.steps, int(entry.get("steps") or 0))

    def on_status(self, event: dict[str, Any]) -> None:
        for entry in event.get("ranks", []):
            self.rows.setdefault(entry.get("local_rank"), {}).update(entry)
        self.view.show(self.rows, self.starts)

    def next_tick(self) -> float | None:
        times = [t for t in (self.check.next_due() if self.check.started else None, self.view.next_plain)
                 if t is not None]
        return min(times) if times else None

    def tick(self, round_index: int) -> Report | None:
        """Due work: a straggler report (returned, already said and logged), a plain status line."""
        now = self.clock()
        report = self.check.due(now) if self.check.started else None
        if report is not None:
            for line in report.lines():
                self.say(line)
            self.log.emit("straggler", round=round_index, **report.to_event())
        line = self.view.plain_line(now, self.rows, self.starts)
        if line:
            self.say(line)
        return report

    def close(self) -> None:
        self.view.close()

    def table(self) -> Any:
        return statusview.table(self.rows, self.starts)


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
        """Due telemetry work; a straggler may stop the job (--stop-on-straggler)."""
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
