"""Which round features this launch asked for, built once at the agent's start in the order they act (the
loop calls them in this order: the health gate, progress tracking, telemetry)."""

from __future__ import annotations

import time
from typing import Any, Callable, Collection, Mapping

from mbr_launch.agent.features import Feature, health
from mbr_launch.agent.features.cycles import CycleFeature, CycleRecords, Members
from mbr_launch.agent.features.health import HealthGate
from mbr_launch.agent.features.telemetry import Telemetry, TelemetryFeature
from mbr_launch.cluster.rendezvous import Rendezvous
from mbr_launch.config.model import LaunchConfig
from mbr_launch.report.events import EventLog

Snapshot = Callable[[], "dict[str, Any] | None"]


def build(cfg: LaunchConfig, *, log: EventLog, say: Callable[[str], None], node: str, environ: Mapping[str, str],
          rendezvous: Rendezvous, hosts_store: Callable[[Any], bool], snapshot: Snapshot,
          own_pids: Callable[[], Collection[int]], clock: Callable[[], float] = time.monotonic) -> list[Feature]:
    """``snapshot``: the rank monitor's latest view (the monitor is started after this, with the features'
    ``monitor_settings``)."""
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
    """ft_launcher 0.6/0.7's progress tracking and cycle-info files."""
    def members() -> Members | None:
        state = rendezvous.state()
        return None if state is None else (state.members, state.outsiders)

    records = CycleRecords(cfg, log=log, say=say, node=node, environ=environ,
                           job_store=lambda rnd: rendezvous.job_store(rnd.store), hosts_store=hosts_store,
                           members=members, snapshot=snapshot)
    records.start()
    status_rows = cfg.nvrx.max_no_progress_cycles > 0 and not cfg.nvrx.checkpoint_iteration_file
    return CycleFeature(records, status_rows=status_rows)
