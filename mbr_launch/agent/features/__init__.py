"""The round's optional features (ft_launcher's extras, telemetry) behind one protocol (``context.Feature``): the
loop calls each hook on every feature in ``Context.features``, in that list's order, and never asks which are on.

Where the hooks come in a round, top-down::

    construction   monitor_settings   what the rank monitor must send (step deadlines, status rows)
    before a join  before_join        a health check may keep this node out: its exit code
                   closed             the rendezvous was closed by the node that ended the job: its code and line
    round          round_begins       before the workers start
                   workers_started    after they (or some of them) start
                   observe            a rank's first sign of progress, the monitor's steps and status rows
                   tick               once per loop turn: may end the round (a straggler stop)
                   detected           a hang's verdict: what follows is restart time
                   attempt_ended      the workers stop (a failure, a peer's stop)
                   on_failure         a job-wide restart (or the spent budget) is decided: end the job instead?
                   round_ended        the round's end, whatever it was
    job's end      job_ends           before the summary; close: at teardown, whatever happened

Each hook's default does nothing, so a feature (a class that names ``Feature`` as its base) writes only those
it uses. Hooks that may end something return an exit code or a result where the loop's own code would.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from mbr_launch.agent.context import Feature

__all__ = ["Feature", "monitor_settings"]


def monitor_settings(features: Iterable[Feature]) -> dict[str, Any]:
    """Every feature's rank monitor settings in one, in the list's order: a later feature's value stands, but
    None is "nothing asked" and replaces nothing (so progress tracking's status rows, asked before telemetry,
    are sent at the status display's interval where there is a display, and at their own where there is none)."""
    merged: dict[str, Any] = {}
    for feature in features:
        asked: Mapping[str, Any] = feature.monitor_settings()
        merged.update({key: value for key, value in asked.items() if value is not None or key not in merged})
    return merged
