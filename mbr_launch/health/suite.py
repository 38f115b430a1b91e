"""The checks a node runs before it joins a round, in NVRx's order (``ensure_node_is_healthy``), up to the
first failure, with the reads injected. NVRx's GPU recovery action check is the doctor's ``gpu.recovery``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from mbr_launch.config.model import NvrxLauncherSpec
from mbr_launch.health import checks, nodehealth, readers
from mbr_launch.health.checks import ProbeReport, SegmentArtifact
from mbr_launch.health.result import CheckResult


@dataclass(frozen=True)
class Readers:
    """Everything the checks read (tests pass fakes)."""

    probe_paths: Callable[[str, Sequence[str]], ProbeReport] = readers.probe_paths
    link_states: Callable[[str | None], Mapping[str, str | None]] = readers.link_states
    lustre_health: Callable[[], tuple[str | None, str | None]] = readers.lustre_health
    mountinfo: Callable[[], str] = readers.mountinfo
    segment_artifact: Callable[[str], SegmentArtifact] = readers.segment_artifact
    node_health: Callable[[str], "nodehealth.Reply | str"] = nodehealth.query


def configured(spec: NvrxLauncherSpec) -> bool:
    """Whether this launch asked for any pre-rendezvous check."""
    return bool(spec.enable_nic_healthcheck or spec.enable_dist_storage_healthcheck or spec.storage_healthcheck_paths
                or spec.node_health_check_endpoint or spec.segment_health_check_dir)


def nic_baseline(spec: NvrxLauncherSpec, read: Readers) -> dict[str, str]:
    """The port states the NIC check compares with, taken when the agent starts (as NVRx does)."""
    if not spec.enable_nic_healthcheck:
        return {}
    return {nic: state for nic, state in read.link_states(spec.link_state_path_template).items() if state is not None}


def run_checks(spec: NvrxLauncherSpec, environ: Mapping[str, str], baseline: Mapping[str, str],
               read: Readers) -> list[CheckResult]:
    """The configured checks up to the first failure (the last result then); skipped ones say why."""
    steps: list[Callable[[], CheckResult]] = []
    if spec.segment_health_check_dir:
        path = checks.segment_path(spec.segment_health_check_dir, environ)
        steps.append(lambda: checks.segment(read.segment_artifact(path) if path else None))
    if spec.enable_nic_healthcheck:
        steps.append(lambda: checks.nic_links(baseline, read.link_states(spec.link_state_path_template)
                                              if baseline else {}))
    if spec.enable_dist_storage_healthcheck:
        steps.append(lambda: _dist_storage(read))
    if spec.storage_healthcheck_paths:
        paths = list(spec.storage_healthcheck_paths)
        steps.append(lambda: checks.storage_paths(paths, read.probe_paths("read", paths)))
    if spec.node_health_check_endpoint:
        steps.append(lambda: _node_health(spec.node_health_check_endpoint or "", read))
    results: list[CheckResult] = []
    for step in steps:
        results.append(step())
        if not results[-1].ok:
            break
    return results


def _dist_storage(read: Readers) -> CheckResult:
    lustre, error = read.lustre_health()
    mounts = checks.network_mounts(read.mountinfo()) if not error and (lustre is None or lustre.strip() == "healthy") else []
    report = read.probe_paths("list", mounts) if mounts else None
    return checks.dist_storage(lustre, error, mounts, report)


def _node_health(endpoint: str, read: Readers) -> CheckResult:
    path = nodehealth.socket_path(endpoint)
    if path is None:
        return CheckResult.passed(checks.NODE_HEALTH, f"{endpoint!r} is not a unix socket (unix:///PATH or /PATH): "
                                                      "only the node-health daemon's unix socket is supported",
                                  skipped=True)
    reply = read.node_health(path)
    if isinstance(reply, str):
        return CheckResult.passed(checks.NODE_HEALTH, reply, skipped=True)
    return checks.node_health(reply)
