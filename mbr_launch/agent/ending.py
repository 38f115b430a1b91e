"""How a run ends for this node: the summary, goodput, the ``end`` event, and Slurm requeue on preemption."""

from __future__ import annotations

import signal
import sys

from mbr_launch.agent.context import Context
from mbr_launch.cluster.round import Round
from mbr_launch.cluster.stops import StopMessage
from mbr_launch.cluster.requeue import maybe_requeue
from mbr_launch.decide.goodput import compute
from mbr_launch.decide.goodput_text import render
from mbr_launch.report import exitcodes
from mbr_launch.report.appender import describe
from mbr_launch.report.summary import loss_lines
from mbr_launch.visible import visible


def finish(ctx: Context, code: int, reason: str) -> int:
    ctx.summary.exit_code, ctx.summary.reason = code, reason
    for feature in ctx.features:
        feature.job_ends(ctx, code)
    _goodput(ctx)
    ctx.group.settle_output(timeout=0.5)  # the pumps' last words (output_lost) come before the end
    ctx.log.emit("end", exit_code=code, reason=reason, seconds=round(ctx.clock() - ctx.started, 3))
    ctx.summary.losses = loss_lines(ctx.log.records, ctx.log.lost, describe(ctx.log.write_error))
    text = ctx.summary.render()
    if text:  # it quotes the workers (an error file's message and traceback): no control character gets through
        print(visible(text), file=sys.stderr, flush=True)
    ctx.say(f"done: {reason} (exit code {code}); logs and events in {ctx.run_dir}")
    return code


def final_code(ctx: Context, message: StopMessage) -> tuple[int, str]:
    """The code and reason a final stop ends this node's run with. Agents end a job with 0 only by "all done",
    so a stop claiming 0 while workers here had not succeeded is forged (unless --ft-no-restart-exit-code 0)."""
    if (message.exit_code != exitcodes.OK or ctx.group.all_succeeded()
            or ctx.cfg.nvrx.no_restart_exit_code == exitcodes.OK):
        return message.exit_code, message.reason
    origin = f"node {message.origin}" if message.origin else "a peer"
    return exitcodes.FAILED, (f"{message.reason} [a stop from {origin} claimed the job succeeded (exit 0) while "
                              f"this node's workers had not finished: exit {exitcodes.FAILED} instead]")


def finish_signaled(ctx: Context, signum: int, rnd: Round | None) -> int:
    """128+N, as a shell reports it; a preemption signal: exit 5, after a Slurm requeue where allowed."""
    name = signal.Signals(signum).name
    if name not in ctx.cfg.preemption.signals:
        return finish(ctx, 128 + signum, f"launcher received {name}")
    requeued = maybe_requeue(ctx.cfg, rnd.group_rank if rnd else ctx.cfg.rendezvous.node_rank, ctx.say)
    if requeued is not None:
        ctx.log.emit("requeue", job=ctx.cfg.slurm.job_id if ctx.cfg.slurm else None, ok=requeued)
    return finish(ctx, exitcodes.PREEMPTED, f"preempted by {name}" + (" (job requeued)" if requeued else ""))


def _goodput(ctx: Context) -> None:
    if not any(r.get("event") == "progress" for r in ctx.log.records):
        return
    result = compute(ctx.log.records, wall=ctx.log.t_of(ctx.clock()))
    ctx.summary.goodput = render(result)
    ctx.log.emit("goodput", **result.to_event())
