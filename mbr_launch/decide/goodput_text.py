"""Words for goodput: the summary's block, each bucket named and explained. Pure; a ``Goodput`` in, text out.

``LABEL`` and ``MEANING`` are shared with the run report, so both say the same thing.
"""

from __future__ import annotations

from mbr_launch.decide.goodput import FailureCost, Goodput

LABEL = {"startup": "start-up", "productive": "training", "lost": "lost work", "detection": "detection",
         "restart": "restart", "other": "other"}
MEANING = {  # short enough that a bucket's line fits in 80 columns
    "startup": "launch -> first optimizer step",
    "productive": "optimizer steps kept (first -> last step)",
    "lost": "steps a failure threw away (since a checkpoint)",
    "detection": "failed attempt's last step -> failure detected",
    "restart": "detection -> next step: stop, rendezvous, start",
    "other": "after the last step: script wind-down, exit",
}
NO_STEPS = "no optimizer steps seen"
NO_STEPS_WHY = ("  (mbr-launch counts step() calls of torch.optim optimizers: a script without one, or a run\n"
                "  with --autobeat off, has no training time to measure)")


def render(g: Goodput) -> str:
    if g.wall <= 0:
        return ""
    if not g.stepped:
        lines = [f"Goodput: {NO_STEPS} in {g.wall:.1f} s from launch to exit", NO_STEPS_WHY]
        lines.extend(_failures(g))
        return "\n".join(lines)
    lines = [f"Goodput: {g.fraction * 100:.1f}% ({g.seconds['productive']:.1f} s of productive steps in "
             f"{g.wall:.1f} s, {g.steps} step(s) on local rank 0)"
             + ("\n  every step was lost to a failure: none was kept" if g.seconds["productive"] <= 0 else "")]
    for kind, seconds in g.seconds.items():
        if seconds <= 0 and kind != "productive":
            continue
        lines.append(f"  {LABEL[kind]:<9} {seconds:6.1f} s {seconds / g.wall * 100:5.1f}%  "
                     + ((_startup_parts(g) if kind == "startup" else "") or MEANING[kind]))
    lines.extend(_failures(g))
    return "\n".join(lines)


def _failures(g: Goodput) -> list[str]:
    return [f"  failure {i} (round {f.round}, {f.cause}): {failure_line(f)}" for i, f in enumerate(g.failures, 1)]


def _startup_parts(g: Goodput) -> str:
    """Start-up in two: the launcher's own and the workers' (until a step)."""
    if g.workers_started is None or g.seconds["startup"] <= g.workers_started:
        return ""
    workers = g.seconds["startup"] - g.workers_started
    return f"launch -> 1st step: launcher {g.workers_started:.1f} s, workers {workers:.1f} s"


def failure_line(f: FailureCost) -> str:
    """One failure's cost, claiming only what the log shows (docs/report.md)."""
    if f.stepped:
        cost = f"lost {f.lost:.1f} s of work, detected {f.detection:.1f} s after the last step"
    else:
        cost = "before the first step of its attempt"
    if f.resumed:
        after = f"training again {f.restart:.1f} s later"
    elif f.restarted:
        after = "restarted; no step seen since"
    else:
        after = "not restarted"
    if f.redone is not None:
        after += f"; {f.redone} iteration(s) redone (reached {f.reached}, resumed at {f.resumed_at})"
    return f"{cost}; {after}"
