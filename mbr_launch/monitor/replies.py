"""Reply frames for the NVRx clients (0.4.1, 0.6, 0.7), written as raw pickle opcodes.

The client unpickles replies into NVRx objects (``OkMsg``, ``ErrorMsg``, ``FaultToleranceConfig``), which the
monitor cannot import (NVRx imports torch), so the pickle is written here: what ``ForkingPickler.dumps`` would
produce, give or take memo opcodes, for the value types used below only.
"""

from __future__ import annotations

import signal
import struct
from dataclasses import dataclass
from typing import Any, Mapping

from mbr_launch.monitor.protocol import _DATA, HEADER, V041

_CONFIG = "nvidia_resiliency_ext.fault_tolerance.config"

_PROTO4 = b"\x80\x04"
_STOP = b"."
_MARK, _SETITEMS, _APPENDS, _BUILD, _NEWOBJ, _REDUCE = b"(", b"u", b"e", b"b", b"\x81", b"R"
_EMPTY_TUPLE, _EMPTY_DICT, _EMPTY_LIST, _TUPLE1 = b")", b"}", b"]", b"\x85"


@dataclass(frozen=True, slots=True)
class Obj:
    """``module.name`` instance with ``state`` as its ``__dict__``."""

    module: str
    name: str
    state: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class EnumMember:
    """``module.name(value)``, e.g. ``signal.Signals(9)``."""

    module: str
    name: str
    value: int


def _global(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def _encode(value: Any) -> bytes:
    if value is None:
        return b"N"
    if value is True:
        return b"\x88"
    if value is False:
        return b"\x89"
    if isinstance(value, int):
        if 0 <= value < 256:
            return b"K" + bytes((value,))
        if -(2**31) <= value < 2**31:
            return b"J" + struct.pack("<i", value)
        raw = value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)
        return b"\x8a" + bytes((len(raw),)) + raw  # LONG1
    if isinstance(value, float):
        return b"G" + struct.pack(">d", value)
    if isinstance(value, str):
        raw = value.encode("utf-8", "surrogatepass")
        return b"X" + struct.pack("<I", len(raw)) + raw
    if isinstance(value, bytes):
        return b"B" + struct.pack("<I", len(value)) + value
    if isinstance(value, dict):
        if not value:
            return _EMPTY_DICT
        items = b"".join(_encode(k) + _encode(v) for k, v in value.items())
        return _EMPTY_DICT + _MARK + items + _SETITEMS
    if isinstance(value, list):
        if not value:
            return _EMPTY_LIST
        return _EMPTY_LIST + _MARK + b"".join(_encode(v) for v in value) + _APPENDS
    if isinstance(value, EnumMember):
        return _global(value.module, value.name) + _encode(value.value) + _TUPLE1 + _REDUCE
    if isinstance(value, Obj):
        head = _global(value.module, value.name) + _EMPTY_TUPLE + _NEWOBJ
        return head + (_encode(dict(value.state)) + _BUILD if value.state else b"")
    raise TypeError(f"cannot encode {type(value).__name__}")


def dumps(value: Any) -> bytes:
    return _PROTO4 + _encode(value) + _STOP


def frame(payload: bytes) -> bytes:
    return HEADER.pack(len(payload)) + payload


def ok_msg(**attrs: Any) -> bytes:
    return dumps(Obj(_DATA, "OkMsg", attrs))


def error_msg(cause: str) -> bytes:
    return dumps(Obj(_DATA, "ErrorMsg", {"cause": cause}))


# NVRx 0.7.0 FaultToleranceConfig fields and defaults, in declaration order (0.6.0 lacks the last three; an
# attribute a client does not read is harmless). For a launcher: heartbeat timeouts are off by default, and
# ``skip_section_response`` makes the client send heartbeats and sections without reading a reply.
CONFIG_DEFAULTS_06: Mapping[str, Any] = {
    "workload_check_interval": 5.0, "initial_rank_heartbeat_timeout": None, "rank_heartbeat_timeout": None,
    "rank_section_timeouts": {}, "rank_out_of_section_timeout": None, "node_health_check_interval": 5.0,
    "safety_factor": 5.0, "rank_termination_signal": "SIGKILL", "log_level": 20, "restart_check_interval": 60.0,
    "enable_nic_monitor": False, "enable_nic_healthcheck": True, "enable_dist_storage_healthcheck": False,
    "storage_healthcheck_path": None, "pci_topo_file": None, "link_down_path_template": None,
    "link_state_path_template": None, "skip_section_response": True, "segment": None, "numa_bind_strict": True,
    "gpu_memory_reclaim_timeout": 50.0, "gpu_memory_tolerance_mb": 512.0, "gpu_memory_poll_interval": 2.0,
    "check_remaining_processes": False, "max_no_progress_cycles": 3, "min_progress_iterations": 1,
    "checkpoint_iteration_file": None, "install_exception_hook": False, "num_warmup_iterations": 5,
    "attribution_endpoint": None, "attribution_stop_action": None, "attribution_export_url": None,
    "cycle_info_dir": None, "segment_health_check_dir": None,
}
# NVRx 0.4.1's fields, in its declaration order, and its defaults: 0.7's but for the heartbeat timeouts.
_FIELDS_041 = ("workload_check_interval", "initial_rank_heartbeat_timeout", "rank_heartbeat_timeout",
               "rank_section_timeouts", "rank_out_of_section_timeout", "node_health_check_interval", "safety_factor",
               "rank_termination_signal", "log_level", "restart_check_interval", "enable_nic_monitor", "pci_topo_file",
               "link_down_path_template")
_HEARTBEATS_041 = {"initial_rank_heartbeat_timeout": 3600.0, "rank_heartbeat_timeout": 2700.0}
CONFIG_DEFAULTS: Mapping[str, Any] = {k: _HEARTBEATS_041.get(k, CONFIG_DEFAULTS_06[k]) for k in _FIELDS_041}
DEFAULTS_OF: Mapping[str, Mapping[str, Any]] = {V041: CONFIG_DEFAULTS}
# The key of the agent's cfg that lists the fields the user set; absent: every key given counts as set.
USER_SET = "user_set"


def client_config(cfg: Mapping[str, Any], version: str) -> dict[str, Any]:
    """The FaultToleranceConfig fields a client of ``version`` gets: what the user set, else its defaults."""
    defaults = DEFAULTS_OF.get(version, CONFIG_DEFAULTS_06)
    user_set = cfg.get(USER_SET)
    chosen = set(cfg) if user_set is None else set(user_set)
    return {k: cfg[k] if k in chosen and k in cfg else default for k, default in defaults.items()}


def signal_number(name: str | int) -> int:
    if isinstance(name, int):
        return signal.Signals(name).value
    key = name.upper()
    return signal.Signals[key if key.startswith("SIG") else "SIG" + key].value


def ft_config(cfg: Mapping[str, Any], version: str = V041) -> Obj:
    """A ``FaultToleranceConfig`` of ``version``'s fields, ``cfg`` over its defaults. BUILD skips
    ``__post_init__``: values must already have NVRx's types (``Signals``, int log level, dict of sections)."""
    defaults = DEFAULTS_OF.get(version, CONFIG_DEFAULTS_06)
    state = {k: cfg.get(k, default) for k, default in defaults.items()}
    state["rank_termination_signal"] = EnumMember("signal", "Signals", signal_number(state["rank_termination_signal"]))
    state["rank_section_timeouts"] = dict(state["rank_section_timeouts"] or {})
    return Obj(_CONFIG, "FaultToleranceConfig", state)


OK_FRAME = frame(ok_msg())
WORKLOAD_OK_FRAME = frame(dumps(b"ok"))
