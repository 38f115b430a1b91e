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

Hooks that may end something return an exit code or a result where the loop's own code would.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Collection, Iterable, Mapping

from mbr_launch.agent.context import Feature
from mbr_launch.agent.features import health
from mbr_launch.agent.features.cycles import CycleFeature, CycleRecords, Members
from mbr_launch.agent.features.health import HealthGate
from mbr_launch.agent.features.telemetry import Telemetry, TelemetryFeature
from mbr_launch.cluster.rendezvous import Rendezvous
from mbr_launch.config.model import LaunchConfig
from mbr_launch.report.events import EventLog


def monitor_settings(features: Iterable[Feature]) -> dict[str, Any]:
    """Every feature's rank monitor settings in one: a later feature's value stands, but None replaces nothing."""
    merged: dict[str, Any] = {}
    for feature in features:
        asked: Mapping[str, Any] = feature.monitor_settings()
        merged.update({key: value for key, value in asked.items() if value is not None or key not in merged})
    return merged


Snapshot = Callable[[], "dict[str, Any] | None"]


def build_features(cfg: LaunchConfig, *, log: EventLog, say: Callable[[str], None], node: str,
                   environ: Mapping[str, str], rendezvous: Rendezvous, hosts_store: Callable[[Any], bool],
                   snapshot: Snapshot, own_pids: Callable[[], Collection[int]],
                   clock: Callable[[], float] = time.monotonic) -> list[Feature]:
    features: list[Feature] = []
    if health.wanted(cfg):
        features.append(HealthGate(cfg, environ, own_pids=own_pids))
    if CycleRecords.wanted(cfg):
        features.append(_cycles(cfg, log=log, say=say, node=node, environ=environ, rendezvous=rendezvous,
                                hosts_store=hosts_store, snapshot=snapshot))
    features.append(TelemetryFeature(Telemetry(cfg, log, say, clock=clock, snapshot=snapshot)))
    return features


def _cycles(cfg: LaunchConfig, *, log: EventLog, say: Callable[[str], None], node: str, environ: Mapping[str, str],
            rendezvous: Rendezvous, hosts_store: Callable[[Any], bool], snapshot: Snapshot) -> CycleFeature:
    def members() -> Members | None:
        state = rendezvous.state()
        return None if state is None else (state.members, state.outsiders)

    records = CycleRecords(cfg, log=log, say=say, node=node, environ=environ,
                           job_store=lambda rnd: rendezvous.job_store(rnd.store), hosts_store=hosts_store,
                           members=members, snapshot=snapshot)
    records.start()
    status_rows = cfg.nvrx.max_no_progress_cycles > 0 and not cfg.nvrx.checkpoint_iteration_file
    return CycleFeature(records, status_rows=status_rows)
