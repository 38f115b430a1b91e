"""The checks a node runs before it joins a round, in NVRx's order (``ensure_node_is_healthy``), up to the
first failure, and what they read (``Readers``: tests pass fakes); ``checks`` decides. The node-health
daemon's one call is encoded here (four protobuf fields: no protobuf package), through grpcio, imported only
when the daemon's socket exists. NVRx's GPU recovery action check is the doctor's ``gpu.recovery``.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from mbr_launch.config.model import NvrxLauncherSpec
from mbr_launch.fdwait import ready
from mbr_launch.health import checks
from mbr_launch.health.checks import PathStatus, ProbeReport, Reply, SegmentArtifact, link_state
from mbr_launch.health.result import CheckResult

IB_DEVICES = "/sys/class/infiniband"
LINK_STATE_TEMPLATE = IB_DEVICES + "/{nic}/ports/1/state"  # NVRx's default; {nic}: the device's name
LUSTRE_HEALTH = "/sys/fs/lustre/health_check"
MOUNTINFO = "/proc/self/mountinfo"
PROBE = str(Path(__file__).with_name("probe.py"))
PER_PATH = {"read": 5.0, "list": 15.0}  # seconds per path before its mount counts as hung (NVRx's)
_HEAD = 200  # bytes of a decision file shown in the line that says why
METHOD = "/nvhcd.HealthCheckService/RunHealthCheck"
DEFAULT_ARGS = ("--no-slurm", "--group", "prolog", "epilog", "logs", "gpu")
TIMEOUT = 60.0  # seconds for the daemon's answer (NVRx's request_timeout_sec): it runs a script


# ---- what the checks read --------------------------------------------------------------------------------------------

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


# ---- the node-health daemon ------------------------------------------------------------------------------------------

def socket_path(endpoint: str) -> str | None:
    """The socket of ``unix:///path``, ``/path`` or ``./path``; None for anything else (not supported)."""
    if endpoint.startswith("unix://"):
        return endpoint[len("unix://"):] or None
    if endpoint.startswith(("/", "./")):
        return endpoint
    return None


# the two messages, in protobuf's wire format: varint keys, varints and length-delimited strings

def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int32s go out as ten bytes, two's complement
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError("truncated or overlong varint")
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        pos, shift = pos + 1, shift + 7
        if not byte & 0x80:
            return value, pos


def _fields(data: bytes) -> list[tuple[int, int | bytes]]:
    """(field number, value) pairs: varints as ints, length-delimited as bytes; fixed-width ones skipped."""
    out: list[tuple[int, int | bytes]] = []
    pos = 0
    while pos < len(data):
        key, pos = _read_varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _read_varint(data, pos)
            out.append((number, value))
        elif wire == 2:
            size, pos = _read_varint(data, pos)
            if pos + size > len(data):
                raise ValueError("truncated field")
            out.append((number, data[pos:pos + size]))
            pos += size
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
    if pos != len(data):
        raise ValueError("truncated field")
    return out


def _string(number: int, text: str) -> bytes:
    raw = text.encode()
    return _varint(number << 3 | 2) + _varint(len(raw)) + raw


def encode_request(args: Sequence[str]) -> bytes:
    return b"".join(_string(1, a) for a in args)


def decode_reply(data: bytes) -> Reply:
    values: dict[int, int | bytes] = dict(_fields(data))  # proto3: the last value of a field wins
    code = values.get(2, 0)
    code = code if isinstance(code, int) else 0
    code = (code & 0xFFFFFFFF) - (1 << 32) if code & 0x80000000 else code & 0xFFFFFFFF  # int32

    def text(number: int) -> str:
        value = values.get(number, b"")
        return value.decode(errors="replace") if isinstance(value, bytes) else ""

    success = values.get(1, 0)
    return Reply(success=bool(success) if isinstance(success, int) else False, exit_code=code,
                 output=text(3), error=text(4))


def query(path: str, *, args: Sequence[str] = DEFAULT_ARGS, timeout: float = TIMEOUT) -> Reply | str:
    """The daemon's reply, or why there is none (a reason to skip the check, never a failure)."""
    if not os.path.exists(path):
        return f"{path} does not exist (no node-health daemon on this node)"
    try:
        import grpc  # noqa: PLC0415 - optional, and slow to import: only where a daemon listens
    except ImportError:
        return "grpcio is not installed (pip install grpcio)"
    try:
        with grpc.insecure_channel(f"unix:{path}") as channel:
            call = channel.unary_unary(METHOD, request_serializer=encode_request, response_deserializer=decode_reply)
            return call(list(args), timeout=timeout)
    except grpc.RpcError as err:
        code = err.code() if callable(getattr(err, "code", None)) else None
        details = err.details() if callable(getattr(err, "details", None)) else str(err)
        return f"the daemon at {path} did not answer ({getattr(code, 'name', code)}: {details})"
    except (ValueError, OSError) as err:
        return f"the daemon at {path} did not answer ({type(err).__name__}: {err})"


# ---- the checks, in order --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Readers:
    probe_paths: Callable[[str, Sequence[str]], ProbeReport] = probe_paths
    link_states: Callable[[str | None], Mapping[str, str | None]] = link_states
    lustre_health: Callable[[], tuple[str | None, str | None]] = lustre_health
    mountinfo: Callable[[], str] = mountinfo
    segment_artifact: Callable[[str], SegmentArtifact] = segment_artifact
    node_health: Callable[[str], "Reply | str"] = query


def configured(spec: NvrxLauncherSpec) -> bool:
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
    path = socket_path(endpoint)
    if path is None:
        return CheckResult.passed(checks.NODE_HEALTH, f"{endpoint!r} is not a unix socket (unix:///PATH or /PATH): "
                                                      "only the node-health daemon's unix socket is supported",
                                  skipped=True)
    reply = read.node_health(path)
    if isinstance(reply, str):
        return CheckResult.passed(checks.NODE_HEALTH, reply, skipped=True)
    return checks.node_health(reply)
