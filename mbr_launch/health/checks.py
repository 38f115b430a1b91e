"""The pre-rendezvous checks as pure decisions: what was read comes in, one ``CheckResult`` goes out.

Each rule is ft_launcher 0.7's, as docs/node-checks.md states them; the segment check fails open, as NVRx's.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Mapping, Sequence

from mbr_launch.health.result import CheckResult

STORAGE_PATHS, DIST_STORAGE, NIC_LINKS, SEGMENT, NODE_HEALTH = (
    "storage_paths", "dist_storage", "nic_links", "segment", "node_health")
ACTIVE = "ACTIVE"
NETWORK_FS = ("lustre", "nfs", "nfs4")
_SHOWN = 200  # characters of someone else's text (a daemon's output, a decision file) put in a line


@dataclass(frozen=True)
class PathStatus:
    """What the probe found at one path: ok, missing, invalid, unreadable, not a directory, or hung."""

    path: str
    status: str
    detail: str = ""

    def describe(self) -> str:
        what = {"hung": "did not answer", "invalid": "is not an absolute path"}.get(self.status, f"is {self.status}")
        return f"{self.path} {what}" + (f" ({self.detail})" if self.detail else "")


@dataclass(frozen=True)
class ProbeReport:
    statuses: tuple[PathStatus, ...]
    error: str | None = None  # the probe itself could not run


@dataclass(frozen=True)
class Reply:
    success: bool = False
    exit_code: int = 0
    output: str = ""
    error: str = ""


@dataclass(frozen=True)
class SegmentArtifact:
    """The scheduler's decision file as read: missing, not_regular, empty, nonempty or error."""

    path: str
    kind: str
    head: str = ""  # the start of a non-empty file's text
    error: str = ""


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _SHOWN else text[:_SHOWN] + "..."


def _probed(name: str, paths: Sequence[str], report: ProbeReport, what: str) -> CheckResult:
    if report.error:
        return CheckResult.failed(name, f"could not probe {what}: {report.error}")
    found = {s.path: s for s in report.statuses}
    bad = [found[p].describe() if p in found else f"{p} was not probed" for p in paths
           if p not in found or found[p].status != "ok"]
    if bad:
        return CheckResult.failed(name, "; ".join(bad))
    return CheckResult.passed(name, f"{len(paths)} {what} readable")


def storage_paths(paths: Sequence[str], report: ProbeReport) -> CheckResult:
    wanted = [p for p in paths if p]
    if not wanted:
        return CheckResult.passed(STORAGE_PATHS, "no paths given", skipped=True)
    return _probed(STORAGE_PATHS, wanted, report, "storage path(s)")


def network_mounts(mountinfo: str) -> list[str]:
    """Mount points of lustre, nfs and nfs4 file systems in a /proc/self/mountinfo text, in order, each once."""
    found: list[str] = []
    for line in mountinfo.splitlines():
        head, sep, tail = line.partition(" - ")
        fields, rest = head.split(), tail.split()
        if sep and len(fields) >= 5 and rest and rest[0] in NETWORK_FS:
            # space, tab, newline and backslash come as octal escapes (\040, ...)
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
            if point not in found:
                found.append(point)
    return found


def dist_storage(lustre: str | None, lustre_error: str | None, mounts: Sequence[str],
                 report: ProbeReport | None) -> CheckResult:
    if lustre_error:
        return CheckResult.failed(DIST_STORAGE, f"cannot read Lustre's health_check: {lustre_error}")
    if lustre is not None and lustre.strip() != "healthy":
        return CheckResult.failed(DIST_STORAGE, f"Lustre's health_check says {_clip(lustre)!r}, not 'healthy'")
    if not mounts:
        seen = "Lustre healthy; " if lustre is not None else ""
        return CheckResult.passed(DIST_STORAGE, f"{seen}no lustre/nfs mounts", skipped=lustre is None)
    assert report is not None
    return _probed(DIST_STORAGE, mounts, report, "network mount(s)")


def link_state(text: str) -> str:
    """A port state file's text ("4: ACTIVE", or just "ACTIVE") -> "ACTIVE"."""
    text = text.strip()
    return text.split(":", 1)[1].strip() if ":" in text else text


def nic_links(baseline: Mapping[str, str], current: Mapping[str, str | None]) -> CheckResult:
    """Ports ACTIVE at the agent's start must still be ACTIVE (a port whose state file is gone: skipped)."""
    if not baseline:
        return CheckResult.passed(NIC_LINKS, "no InfiniBand ports", skipped=True)
    down = [f"{nic} is {current.get(nic)} (was {state})" for nic, state in sorted(baseline.items())
            if state == ACTIVE and current.get(nic) is not None and current.get(nic) != ACTIVE]
    if down:
        return CheckResult.failed(NIC_LINKS, "NIC link(s) down: " + ", ".join(down))
    return CheckResult.passed(NIC_LINKS, ", ".join(f"{nic}={current.get(nic) or 'gone'}" for nic in sorted(baseline)))


def segment_path(directory: str | None, environ: Mapping[str, str]) -> str | None:
    """This Slurm array task's decision file, ``<dir>/segment_health_check.<job>.<task>`` (task: the job id
    outside an array); None without a directory or outside a Slurm job."""
    if not directory:
        return None
    job = environ.get("SLURM_ARRAY_JOB_ID") or environ.get("SLURM_JOB_ID")
    if not job:
        return None
    task = environ.get("SLURM_ARRAY_TASK_ID") or job
    return f"{directory.rstrip('/')}/segment_health_check.{job}.{task}"


def segment(artifact: SegmentArtifact | None) -> CheckResult:
    if artifact is None:
        return CheckResult.passed(SEGMENT, "not in a Slurm job", skipped=True)
    if artifact.kind == "nonempty":
        said = f": {_clip(artifact.head)!r}" if artifact.head.strip() else ""
        return CheckResult.failed(SEGMENT, f"the scheduler excluded this segment ({artifact.path} is not empty{said})")
    seen = {"missing": "no decision file", "empty": "decision file empty",
            "not_regular": f"ignored {artifact.path}: not a regular file",
            "error": f"ignored {artifact.path}: {artifact.error}"}.get(artifact.kind, artifact.kind)
    return CheckResult.passed(SEGMENT, seen)


def node_health(reply: Reply) -> CheckResult:
    if not reply.success:
        parts = [f"the node-health daemon reports failure (exit code {reply.exit_code})"]
        if reply.error:
            parts.append(f"error: {_clip(reply.error)}")
        if reply.output:
            parts.append(f"output: {_clip(reply.output)}")
        return CheckResult.failed(NODE_HEALTH, "; ".join(parts))
    try:
        result = json.loads(reply.output)
    except (ValueError, TypeError):
        return CheckResult.passed(NODE_HEALTH, "healthy (output not JSON; ignored)")
    count = result.get("fail_count") if isinstance(result, dict) else None
    if isinstance(count, bool) or not isinstance(count, (int, float)):
        return CheckResult.passed(NODE_HEALTH, "healthy (no fail_count in the output; ignored)")
    if count > 0:
        failed = result.get("failed_checks") or []
        named = ", ".join(str(f) for f in failed) if isinstance(failed, list) else str(failed)
        return CheckResult.failed(NODE_HEALTH, f"the node-health daemon counts {count:g} failed check(s)"
                                  + (f": {_clip(named)}" if named else ""))
    return CheckResult.passed(NODE_HEALTH, "healthy (fail_count 0)")
