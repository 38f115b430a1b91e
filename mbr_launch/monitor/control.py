"""The agent <-> monitor control channel: JSON lines on the monitor's stdin and stdout.

Agent -> monitor (one object per line):
  {"op":"configure","dir":D,"cfg":{...FaultToleranceConfig fields...},
   "steps":{"initial":S|null,"subsequent":S|null,"report_interval":S,"status_interval":S|null}}
                                                                          -> {"ev":"ready","launcher_socket":..}
  {"op":"arm","local_rank":L,"rank":R,"pid":P|null,"pgid":G|null,"socket":D/rmonL.sock,
   "step_socket":D/stepsL.sock|absent}                                    -> {"ev":"armed",..}
  {"op":"pid","local_rank":L,"pid":P,"pgid":G}                            (no reply)
  {"op":"disarm","local_rank":L}                                          -> {"ev":"disarmed","local_rank":L}
  {"op":"snapshot"}                                                       -> {"ev":"snapshot","ranks":[..]}
  {"op":"exit"}                                                           (no reply; exit 0)
  EOF: SIGKILL the process group of every armed worker, exit.

Monitor -> agent, unsolicited: connected, first_heartbeat, expired, timeouts_updated, workload_request,
disconnected, error. A bad control line yields {"ev":"error","message":..,"op":..} and nothing else.

Automatic step beats (``steps.py``; a datagram socket per rank when ``arm`` names one):
  {"ev":"first_step","local_rank":L,"rank":R,"t":seconds since arm,"monotonic":M}
  {"ev":"expired",...,"kind":"step","step":last step index}            (step deadline passed)
  {"ev":"steps","ranks":[{"local_rank":L,"rank":R,"nvrx_client":bool,"steps":N,"index":I,
     "periods":[s..],"cpu":[s..],"first":M,"last":M,"checkpoint":M|null}]}   at most every report_interval
  {"ev":"status","ranks":[..as in snapshot..]}                          every status_interval, when set
  (M: time.monotonic() of this host, the agent's clock too.)
"""

from __future__ import annotations

import json
import math
import os
import stat
from typing import Any, Callable, Iterator, Optional, Union

from mbr_launch.monitor.deadlines import Timeouts


class ControlError(Exception):
    """A control message the monitor cannot act on; reported as an ``error`` event."""


class Emitter:
    """Writes events to a file descriptor, one JSON object per line, unbuffered (the agent polls it)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.on_broken: Optional[Callable[[], None]] = None
        self.broken = False

    def emit(self, event: dict[str, Any]) -> None:
        if self.broken:
            return
        data = (json.dumps(event, separators=(",", ":")) + "\n").encode()
        try:
            while data:
                data = data[os.write(self.fd, data) :]
        except (BrokenPipeError, OSError):
            self.broken = True  # the agent is gone: same as stdin EOF
            if self.on_broken is not None:
                self.on_broken()


class LineReader:
    """Accumulates bytes into lines; yields each parsed object, or a ControlError for a bad line."""

    def __init__(self, limit: int = 1 << 20) -> None:
        self.buf = b""
        self.limit = limit

    def feed(self, data: bytes) -> Iterator[Union[dict[str, Any], ControlError]]:
        self.buf += data
        while b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            if not line.strip():
                continue
            try:
                msg = json.loads(line)
            except ValueError as exc:
                yield ControlError(f"bad control line: {exc}")
                continue
            yield msg if isinstance(msg, dict) else ControlError("control line is not an object")
        if len(self.buf) > self.limit:
            self.buf = b""
            yield ControlError("control line too long")


def check_private_dir(path: Any) -> str:
    """The socket directory must be ours and closed to others: no socket in a shared temp dir."""
    if not isinstance(path, str) or not path:
        raise ControlError("configure: dir must be a path")
    try:
        st = os.stat(path)
    except OSError as exc:
        raise ControlError(f"configure: {exc}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise ControlError(f"configure: {path} is not a directory")
    if st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise ControlError(f"configure: {path} must be owned by us with mode 0700 (is {st.st_mode & 0o777:o})")
    return os.path.realpath(path)


def parse_socket_path(path: Any, directory: str) -> str:
    if not isinstance(path, str) or not path:
        raise ControlError("arm: socket must be a path")
    if os.path.dirname(os.path.realpath(path)) != directory:
        raise ControlError(f"arm: socket {path} is not directly inside {directory}")
    return path


def _timeout(key: str, value: Any) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or value < 0:
        raise ControlError(f"configure: {key} must be a non-negative number or null, got {value!r}")
    return float(value)


def configured_timeouts(cfg: dict[str, Any]) -> Timeouts:
    sections = cfg.get("rank_section_timeouts") or {}
    if not isinstance(sections, dict):
        raise ControlError("configure: rank_section_timeouts must be an object")
    return Timeouts(
        initial=_timeout("initial_rank_heartbeat_timeout", cfg.get("initial_rank_heartbeat_timeout")),
        subsequent=_timeout("rank_heartbeat_timeout", cfg.get("rank_heartbeat_timeout")),
        sections={str(k): _timeout(f"rank_section_timeouts.{k}", v) for k, v in sections.items()},
        out_of_section=_timeout("rank_out_of_section_timeout", cfg.get("rank_out_of_section_timeout")),
    )
