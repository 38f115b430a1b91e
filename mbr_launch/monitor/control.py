"""The monitor's end of the agent <-> monitor control channel: JSON lines on its stdin and stdout.

``wire.py`` lists the commands and events. Here: writing events, reading command lines, and validating
the values commands carry (each failure is a ``ControlError``, reported as an ``error`` event).
"""

from __future__ import annotations

import json
import math
import os
import stat
from typing import Any, Callable, Iterator, Optional, Union

from mbr_launch.monitor.deadlines import Timeouts


# Writes one event to the agent. Always called with the monitor's lock held, so events never interleave.
Emit = Callable[[dict[str, Any]], None]


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


def timeout_value(key: str, value: Any) -> Optional[float]:
    """A timeout in seconds from a command; ``None`` (JSON null) disables it."""
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
        initial=timeout_value("initial_rank_heartbeat_timeout", cfg.get("initial_rank_heartbeat_timeout")),
        subsequent=timeout_value("rank_heartbeat_timeout", cfg.get("rank_heartbeat_timeout")),
        sections={str(k): timeout_value(f"rank_section_timeouts.{k}", v) for k, v in sections.items()},
        out_of_section=timeout_value("rank_out_of_section_timeout", cfg.get("rank_out_of_section_timeout")),
    )


def int_field(msg: dict[str, Any], key: str) -> int:
    value = msg.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ControlError(f"{msg.get('op')}: {key} must be an integer")
    return value


def opt_int_field(msg: dict[str, Any], key: str) -> Optional[int]:
    return None if msg.get(key) is None else int_field(msg, key)
