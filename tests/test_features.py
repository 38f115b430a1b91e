"""The round's optional features (``agent.features``): chosen in the order the loop calls them, and the rank
monitor settings they ask for together (progress tracking's status rows, the status display's)."""

from __future__ import annotations

import dataclasses
import io
from typing import Any

import pytest

from mbr_launch.agent.context import Feature
from mbr_launch.agent.features.cycles import CycleRecords
from mbr_launch.agent.features import build_features, monitor_settings
from mbr_launch.agent.features.cycles import PROGRESS_STATUS_INTERVAL, CycleFeature
from mbr_launch.agent.features.health import HealthGate
from mbr_launch.agent.features.telemetry import TelemetryFeature
from mbr_launch.agent.features.telemetry import Telemetry
from mbr_launch.cluster.rendezvous import Rendezvous
from mbr_launch.config.build import build_config
from mbr_launch.config.model import LaunchConfig, NvrxLauncherSpec
from mbr_launch.config.settings import resolve
from mbr_launch.report.events import EventLog

pytestmark = pytest.mark.timeout(60)


def _cfg(**cli: str) -> LaunchConfig:
    # A single node with no port: a private c10d rendezvous, so building asks nothing of the host.
    return build_config(resolve({"status_interval": "5", **cli}, {}, {}), script=__file__, environ={})


def _telemetry(cfg: LaunchConfig) -> TelemetryFeature:
    return TelemetryFeature(Telemetry(cfg, EventLog(None, node="n"), lambda line: None, stream=io.StringIO()))


def _cycles(cfg: LaunchConfig, *, status_rows: bool) -> CycleFeature:
    records = CycleRecords(cfg, log=EventLog(None, node="n"), say=lambda line: None, node="n", environ={},
                           job_store=lambda rnd: None, hosts_store=lambda rnd: False, members=lambda: None)
    return CycleFeature(records, status_rows=status_rows)


def test_progress_tracking_asks_for_status_rows_only_where_the_display_asks_for_none():
    quiet, plain = _cfg(status="off"), _cfg(status="plain")
    # no display: the monitor sends a status row a second, for the ranks' training iterations
    assert monitor_settings([_cycles(quiet, status_rows=True), _telemetry(quiet)])["status_interval"] \
        == PROGRESS_STATUS_INTERVAL
    # the plain display's own interval stands (telemetry comes after progress tracking, as in build_features)
    assert monitor_settings([_cycles(plain, status_rows=True), _telemetry(plain)])["status_interval"] == 5.0
    # progress read from a checkpoint file needs no rows: none asked, none sent
    merged = monitor_settings([_cycles(quiet, status_rows=False), _telemetry(quiet)])
    assert merged == _telemetry(quiet).telemetry.monitor_config() and merged["status_interval"] is None


def test_a_feature_writes_only_the_hooks_it_uses():
    class Nothing(Feature):
        pass

    feature = Nothing()
    assert feature.monitor_settings() == {} and feature.before_join(None, None) is None  # type: ignore[arg-type]
    assert feature.tick(None, None) is None and feature.on_failure(None, None) is None  # type: ignore[arg-type]


def test_the_features_come_in_the_order_they_act_and_only_when_asked(tmp_path):
    def build(cfg: LaunchConfig) -> list[Any]:
        return build_features(cfg, log=EventLog(None, node="n"), say=lambda line: None, node="n", environ={},
                              rendezvous=Rendezvous(cfg), hosts_store=lambda rnd: False, snapshot=lambda: None,
                              own_pids=set)

    plain = _cfg(status="off")
    assert [type(f) for f in build(plain)] == [TelemetryFeature]
    asked = dataclasses.replace(plain, nvrx=NvrxLauncherSpec(max_no_progress_cycles=2, check_remaining_processes=True))
    features = build(asked)
    # the loop calls them in this order: the gate before a join, progress tracking before telemetry on each row
    assert [type(f) for f in features] == [HealthGate, CycleFeature, TelemetryFeature]
    assert monitor_settings(features)["status_interval"] == PROGRESS_STATUS_INTERVAL
    with_file = dataclasses.replace(plain, nvrx=NvrxLauncherSpec(max_no_progress_cycles=2,
                                                                 checkpoint_iteration_file=str(tmp_path / "it")))
    assert monitor_settings(build(with_file))["status_interval"] is None
