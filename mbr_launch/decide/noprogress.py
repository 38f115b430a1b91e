"""Progress across restarts (ft_launcher 0.6/0.7's ``--ft-max-no-progress-cycles``): was a cycle worth
restarting after? Pure: the facts of one cycle and the job-wide record in, the new record and a verdict out.

A cycle (one job-wide round, numbered by the restart count) that ends in a failure is scored by the first
source there is: the checkpoint iteration file, the iteration NVRx 0.6+ clients report, or the optimizer steps
``--autobeat`` counts (from 0 in every cycle). A cycle whose file iteration is unknown is not scored (as 0 it
would count a step back now and a leap forward later), nor is one before anything was ever reported. The rules
as users see them: docs/architecture.md, "Restart policy". The record (``Tracking``) lives in the rendezvous
store, and the first node to score a cycle claims its verdict there for every node.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field, replace
from typing import Any

from mbr_launch import outside


class Source(str, enum.Enum):
    FILE = "checkpoint_file"  # --ft-checkpoint-iteration-file
    ITERATION = "iteration"  # what NVRx 0.6+ clients report
    STEPS = "steps"  # optimizer steps seen by --autobeat


@dataclass(frozen=True)
class Rule:
    max_cycles: int  # --ft-max-no-progress-cycles; 0 or less: tracking is off
    min_iterations: int = 1  # --ft-min-progress-iterations
    file: str | None = None  # --ft-checkpoint-iteration-file

    @property
    def enabled(self) -> bool:
        return self.max_cycles > 0


@dataclass(frozen=True)
class Facts:
    """One cycle's end, as the node that scores it sees it."""

    cycle: int
    file_iteration: int | None = None  # the file's iteration now; None: missing, empty or unreadable
    file_problem: str | None = None  # why it could not be read (None for a file not written yet)
    iteration: int | None = None  # the highest training iteration an NVRx client reported in the cycle
    steps: int | None = None  # the most optimizer steps one rank made in the cycle


@dataclass(frozen=True)
class Stuck:
    """A cycle that made no progress."""

    cycle: int
    source: Source
    start: int | None  # the iteration it had to advance from (None for steps)
    end: int | None  # where it got (steps: how many it made; None: nothing reported)

    def describe(self) -> str:
        if self.source is Source.STEPS:
            return f"cycle {self.cycle}: {self.end or 0} optimizer step{'s' * (self.end != 1)}"
        what = "checkpoint iteration" if self.source is Source.FILE else "iteration"
        end = "none reported" if self.end is None else str(self.end)
        return f"cycle {self.cycle}: {what} {self.start} -> {end}"


@dataclass(frozen=True)
class Tracking:
    """The job-wide record between cycles."""

    baseline: int | None = None  # the iteration the next cycle must advance from (file or iteration source)
    source: Source | None = None  # what ``baseline`` was measured with
    stepped: bool = False  # some cycle made an optimizer step: from then on 0 steps is no progress
    stuck: tuple[Stuck, ...] = ()  # the cycles without progress in a row, oldest first


@dataclass(frozen=True)
class Scored:
    """The verdict on one cycle."""

    cycle: int
    source: Source | None  # None: the cycle was not scored
    start: int | None
    end: int | None
    progress: bool | None  # None: not scored (``note`` says why)
    tracking: Tracking  # the record after this cycle
    stop: bool = False  # the run of cycles without progress reached the limit: do not restart
    note: str = ""
    reason: str = ""  # with ``stop``: the line that says why


def initial(rule: Rule, file_iteration: int | None) -> Tracking:
    """The record before the first cycle: with a checkpoint file, the iteration it held at launch (or 0)."""
    if rule.file:
        return Tracking(baseline=file_iteration or 0, source=Source.FILE)
    return Tracking()


def parse_iteration(text: str) -> int | None:
    """The checkpoint iteration file's content as NVRx reads it (negative: 0); None when not an integer."""
    try:
        return max(0, int(text))  # int() strips white space; "" raises
    except ValueError:
        return None


def score(rule: Rule, tracking: Tracking, facts: Facts) -> Scored:
    if not rule.enabled:
        return _unscored(facts, tracking, "progress tracking is off")
    if rule.file:
        return _absolute(rule, tracking, facts, Source.FILE, facts.file_iteration)
    if facts.iteration is not None or tracking.source is Source.ITERATION:
        return _absolute(rule, tracking, facts, Source.ITERATION, facts.iteration)
    return _steps(rule, tracking, facts)


def _absolute(rule: Rule, tracking: Tracking, facts: Facts, source: Source, end: int | None) -> Scored:
    start = (tracking.baseline or 0) if tracking.source is source else 0
    if source is Source.FILE and end is None:
        why = facts.file_problem or f"{rule.file} holds no iteration yet"
        return _unscored(facts, tracking, f"checkpoint iteration unknown ({why}): cycle not scored")
    if start == 0 and not end:  # as NVRx: 0 before and 0 now means nothing was reported yet
        return _unscored(facts, tracking, "no iteration reported yet: cycle not scored")
    progress = end is not None and end - start >= rule.min_iterations
    after = replace(tracking, baseline=start if end is None else end, source=source)
    return _judged(rule, after, facts, Stuck(facts.cycle, source, start, end), progress)


def _steps(rule: Rule, tracking: Tracking, facts: Facts) -> Scored:
    steps = facts.steps or 0
    if not steps and not tracking.stepped:
        return _unscored(facts, tracking, "no optimizer step or iteration seen yet: cycle not scored")
    after = replace(tracking, stepped=True)
    return _judged(rule, after, facts, Stuck(facts.cycle, Source.STEPS, None, steps), steps >= rule.min_iterations)


def _judged(rule: Rule, tracking: Tracking, facts: Facts, this: Stuck, progress: bool) -> Scored:
    stuck = () if progress else (*tracking.stuck, this)
    after = replace(tracking, stuck=stuck)
    stop = len(stuck) >= rule.max_cycles
    return Scored(cycle=facts.cycle, source=this.source, start=this.start, end=this.end, progress=progress,
                  tracking=after, stop=stop, reason=stop_line(rule, stuck) if stop else "")


def _unscored(facts: Facts, tracking: Tracking, note: str) -> Scored:
    return Scored(cycle=facts.cycle, source=None, start=None, end=None, progress=None, tracking=tracking, note=note)


SHOWN = 6  # cycles listed in the stop line; a longer run shows its first two and last three


def stop_line(rule: Rule, stuck: tuple[Stuck, ...]) -> str:
    shown = [s.describe() for s in stuck]
    if len(shown) > SHOWN:
        shown = [*shown[:2], "...", *shown[-3:]]
    return (f"no progress in {len(stuck)} cycle{'s' * (len(stuck) != 1)} in a row ({'; '.join(shown)}; an advance "
            f"of at least {rule.min_iterations} needed): not restarting (--ft-max-no-progress-cycles "
            f"{rule.max_cycles})")


def cycle_line(rule: Rule, scored: Scored) -> str:
    """One line for a cycle that made no progress, or was not scored."""
    if scored.progress is None:
        return f"cycle {scored.cycle}: {scored.note}"
    run = len(scored.tracking.stuck)
    last = scored.tracking.stuck[-1].describe() if run else f"cycle {scored.cycle}"
    return f"{last}: no progress, {run} of {rule.max_cycles} cycles in a row"


# ---- the store's copy (JSON, ``outside.json_value``): anything unreadable reads as "nothing recorded" ----


def encode(scored: Scored) -> str:
    t = scored.tracking
    return json.dumps({"cycle": scored.cycle, "source": scored.source, "start": scored.start, "end": scored.end,
                       "progress": scored.progress, "stop": scored.stop, "note": scored.note,
                       "reason": scored.reason, "tracking": encode_tracking(t)})


def decode(raw: bytes | str) -> Scored | None:
    try:
        data = outside.json_value(raw)
        tracking = decode_tracking(data["tracking"])
        if tracking is None:
            return None
        return Scored(cycle=_int(data["cycle"], 0), source=_source(data.get("source")),
                      start=outside.integer(data.get("start")), end=outside.integer(data.get("end")),
                      progress=data.get("progress") if isinstance(data.get("progress"), bool) else None,
                      tracking=tracking, stop=data.get("stop") is True, note=outside.text(data.get("note")),
                      reason=outside.text(data.get("reason")))
    except Exception:  # noqa: BLE001 - another node's value, refused (RefusedValue) or of another shape
        return None


def encode_tracking(t: Tracking) -> dict[str, Any]:
    return {"baseline": t.baseline, "source": t.source, "stepped": t.stepped,
            "stuck": [[s.cycle, s.source, s.start, s.end] for s in t.stuck]}


def decode_tracking(data: Any) -> Tracking | None:
    if isinstance(data, (str, bytes)):
        try:
            data = outside.json_value(data)
        except outside.RefusedValue:
            return None
    if not isinstance(data, dict):
        return None
    stuck = []
    stuck_items = data.get("stuck") or []
    if not isinstance(stuck_items, list) or len(stuck_items) > 10_000:
        return None
    for item in stuck_items:
        source = _source(item[1]) if isinstance(item, list) and len(item) == 4 else None
        if source is None:
            return None
        stuck.append(Stuck(_int(item[0], 0), source, outside.integer(item[2]), outside.integer(item[3])))
    return Tracking(baseline=outside.integer(data.get("baseline")), source=_source(data.get("source")),
                    stepped=data.get("stepped") is True, stuck=tuple(stuck))


def _source(value: Any) -> Source | None:
    try:
        return Source(value)
    except ValueError:
        return None


def _int(value: Any, default: int) -> int:
    got = outside.integer(value)
    return default if got is None else got
