"""What the pre-rendezvous checks read (sysfs, /proc, the decision file, a probe process); ``checks`` decides."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

from mbr_launch.fdwait import ready
from mbr_launch.health.checks import PathStatus, ProbeReport, SegmentArtifact, link_state

IB_DEVICES = "/sys/class/infiniband"
LINK_STATE_TEMPLATE = IB_DEVICES + "/{nic}/ports/1/state"  # NVRx's default; {nic}: the device's name
LUSTRE_HEALTH = "/sys/fs/lustre/health_check"
MOUNTINFO = "/proc/self/mountinfo"
PROBE = str(Path(__file__).with_name("probe.py"))
PER_PATH = {"read": 5.0, "list": 15.0}  # seconds per path before its mount counts as hung (NVRx's)
_HEAD = 200  # bytes of a decision file shown in the line that says why


def probe_paths(mode: str, paths: Sequence[str], timeout: float | None = None) -> ProbeReport:
    """Each path's status from a probe process; the path it is on when ``timeout`` passes is ``hung``."""
    if not paths:
        return ProbeReport(())
    timeout = PER_PATH[mode] * len(paths) if timeout is None else timeout
    try:
        proc = subprocess.Popen([sys.executable, "-I", "-S", PROBE, mode, *paths], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, close_fds=True)
    except OSError as err:
        return ProbeReport((), error=f"cannot start the probe: {err.strerror or err}")
    assert proc.stdout is not None
    statuses: list[PathStatus] = []
    buffer = b""
    deadline = time.monotonic() + timeout
    fd = proc.stdout.fileno()
    try:
        while len(statuses) < len(paths):
            left = deadline - time.monotonic()
            if left <= 0 or not ready([fd], left):  # poll(2): the agent's descriptors may pass 1024
                statuses.append(PathStatus(paths[len(statuses)], "hung", f"no answer within {timeout:g} s"))
                break
            chunk = os.read(fd, 65536)
            if not chunk:
                break  # the probe died: the paths it did not report count as not probed
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                try:
                    item = json.loads(line)
                    statuses.append(PathStatus(str(item["path"]), str(item["status"]), str(item.get("detail", ""))))
                except (ValueError, KeyError, TypeError):
                    return ProbeReport(tuple(statuses), error=f"the probe wrote {line[:80]!r}")
    finally:
        proc.stdout.close()
        if proc.poll() is None:
            proc.kill()
        try:
            proc.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            pass  # stuck in the kernel on a dead mount: reaped by the next stop's zombie sweep
    return ProbeReport(tuple(statuses))


def link_states(template: str | None = None, devices: str = IB_DEVICES) -> dict[str, str | None]:
    """Each InfiniBand device's port state, None where its state file does not read (no InfiniBand: empty)."""
    template = template or LINK_STATE_TEMPLATE
    try:
        names = sorted(os.listdir(devices))
    except OSError:
        return {}
    states: dict[str, str | None] = {}
    for name in names:
        try:
            states[name] = link_state(Path(template.replace("{nic}", name)).read_text())
        except OSError:
            states[name] = None
    return states


def lustre_health(path: str = LUSTRE_HEALTH) -> tuple[str | None, str | None]:
    """(text, error): (None, None) where there is no Lustre health file (no Lustre client here)."""
    try:
        return Path(path).read_text(), None
    except FileNotFoundError:
        return None, None
    except OSError as err:
        return None, err.strerror or str(err)


def mountinfo(path: str = MOUNTINFO) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def segment_artifact(path: str) -> SegmentArtifact:
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return SegmentArtifact(path, "missing")
    except OSError as err:
        return SegmentArtifact(path, "error", error=err.strerror or str(err))
    if not stat.S_ISREG(info.st_mode):
        return SegmentArtifact(path, "not_regular")
    if info.st_size == 0:
        return SegmentArtifact(path, "empty")
    try:
        with open(path, "rb") as f:
            head = f.read(_HEAD).decode(errors="replace")
    except OSError:
        head = ""
    return SegmentArtifact(path, "nonempty", head=head)
