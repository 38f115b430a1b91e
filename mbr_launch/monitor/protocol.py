"""The NVRx 0.4.1 rank-monitor wire protocol, decoded without NVRx and without trusting the peer.

Frames are a 4-byte big-endian length followed by a pickle made by ``ForkingPickler``. NVRx unpickles
whatever arrives, which makes its socket a code-execution door for anyone who can connect. Here a
restricted ``Unpickler`` resolves only the exact (module, name) pairs the 0.4.1 client sends, and maps
them to inert shim classes defined below; every other global raises ``ProtocolError``. The decoded shims
are then validated into small frozen request records, which is all the server ever sees.

Importing NVRx is not an option anyway: it imports torch, and the monitor must start in milliseconds.
"""

from __future__ import annotations

import enum
import io
import math
import pickle
import struct
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Union

HEADER = struct.Struct(">I")
# A real client message is a few hundred bytes; a state_dict-sized UpdateConfigMsg stays far below this.
MAX_FRAME = 1 << 20
_DATA = "nvidia_resiliency_ext.fault_tolerance.data"


class ProtocolError(Exception):
    """The peer sent something that is not a valid 0.4.1 client message; drop the connection."""


class BadRequest(Exception):
    """A well-formed message with an invalid value: answer ``ErrorMsg`` and keep the connection."""


# ---- shims: what the restricted unpickler builds instead of the NVRx classes -------------------------


class _Shim:
    """Inert attribute bag. ``__setstate__`` keeps only declared fields, so BUILD cannot plant others."""

    FIELDS: tuple[str, ...] = ()

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) == 2 and state[1] is None:
            state = state[0]  # (dict_state, slot_state) form
        if not isinstance(state, dict):
            raise ProtocolError(f"{type(self).__name__}: unexpected pickled state")
        for key, value in state.items():
            if key in self.FIELDS:
                self.__dict__[key] = value

    def get(self, name: str, default: Any = None) -> Any:
        return self.__dict__.get(name, default)


class AuthkeyMsgShim(_Shim):
    FIELDS = ("authkey",)


class InitMsgShim(_Shim):
    FIELDS = ("rank_info", "iteration", "num_warmup_iters")


class RankInfoShim(_Shim):
    FIELDS = ("global_rank", "local_rank", "host", "pid")


class HeartbeatMsgShim(_Shim):
    FIELDS = ("rank", "state")


class SectionMsgShim(_Shim):
    FIELDS = ("rank", "section", "action")


class UpdateConfigMsgShim(_Shim):
    FIELDS = ("hb_timeouts", "section_timeouts")


class HeartbeatTimeoutsShim(_Shim):
    FIELDS = ("initial", "subsequent", "were_calculated")


class SectionTimeoutsShim(_Shim):
    FIELDS = ("section", "out_of_section", "calculated_sections", "is_out_of_section_calculated")


class WorkloadControlRequestShim(_Shim):
    FIELDS = ("action", "description")


class SectionAction(enum.Enum):
    OPEN = 1
    CLOSE = 2
    CLOSE_ALL = 3


class WorkloadAction(enum.Enum):
    Continue = 0
    ExcludeThisNode = 1
    ShutdownWorkload = 2


# Exactly what the 0.4.1 client pickles (checked with pickletools); protocol 4 encodes sets with
# EMPTY_SET/ADDITEMS, `set`/`frozenset` are here for peers pickling with protocol 2 or 3.
ALLOWED: Mapping[tuple[str, str], type] = {
    (_DATA, "AuthkeyMsg"): AuthkeyMsgShim,
    (_DATA, "InitMsg"): InitMsgShim,
    (_DATA, "RankInfo"): RankInfoShim,
    (_DATA, "HeartbeatMsg"): HeartbeatMsgShim,
    (_DATA, "SectionMsg"): SectionMsgShim,
    (_DATA, "SectionAction"): SectionAction,
    (_DATA, "UpdateConfigMsg"): UpdateConfigMsgShim,
    (_DATA, "HeartbeatTimeouts"): HeartbeatTimeoutsShim,
    (_DATA, "SectionTimeouts"): SectionTimeoutsShim,
    (_DATA, "WorkloadControlRequest"): WorkloadControlRequestShim,
    (_DATA, "WorkloadAction"): WorkloadAction,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
}


class RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        try:
            return ALLOWED[(module, name)]
        except KeyError:
            raise ProtocolError(f"refused to unpickle global {module}.{name}") from None

    def persistent_load(self, pid: Any) -> Any:
        raise ProtocolError("refused a persistent id")


def unpickle(payload: bytes) -> Any:
    if len(payload) > MAX_FRAME:
        raise ProtocolError(f"frame of {len(payload)} bytes exceeds {MAX_FRAME}")
    try:
        return RestrictedUnpickler(io.BytesIO(payload)).load()
    except ProtocolError:
        raise
    except Exception as exc:  # any malformed pickle: truncated, bad opcode, bad constructor args
        raise ProtocolError(f"malformed pickle: {type(exc).__name__}: {exc}") from None


def frame_length(header: bytes) -> int:
    """Validate a 4-byte length prefix; a zero or oversized length means the stream is garbage."""
    (n,) = HEADER.unpack(header)
    if n == 0 or n > MAX_FRAME:
        raise ProtocolError(f"bad frame length {n}")
    return n


# ---- validated requests: what the server acts on ------------------------------------------------------

Timeout = Optional[float]


@dataclass(frozen=True, slots=True)
class Authkey:
    pass


@dataclass(frozen=True, slots=True)
class Init:
    rank: Optional[int]
    local_rank: Optional[int]
    host: str
    pid: Optional[int]


@dataclass(frozen=True, slots=True)
class Heartbeat:
    pass


@dataclass(frozen=True, slots=True)
class SectionOpen:
    name: str


@dataclass(frozen=True, slots=True)
class SectionClose:
    name: str


@dataclass(frozen=True, slots=True)
class SectionCloseAll:
    pass


@dataclass(frozen=True, slots=True)
class HbTimeouts:
    initial: Timeout
    subsequent: Timeout
    were_calculated: Optional[bool]


@dataclass(frozen=True, slots=True)
class SecTimeouts:
    section: Mapping[str, Timeout]
    out_of_section: Timeout
    calculated_sections: tuple[str, ...]
    is_out_of_section_calculated: bool


@dataclass(frozen=True, slots=True)
class UpdateConfig:
    hb: Optional[HbTimeouts]
    section: Optional[SecTimeouts]


@dataclass(frozen=True, slots=True)
class Invalid:
    """Decodes fine but cannot be honoured; the reply is ``ErrorMsg(cause)``."""

    cause: str


@dataclass(frozen=True, slots=True)
class WorkloadRequest:
    rank: Optional[int]
    action: str
    description: str


Request = Union[Authkey, Init, Heartbeat, SectionOpen, SectionClose, SectionCloseAll, UpdateConfig, Invalid]


def _int_or_none(value: Any) -> Optional[int]:
    # The client sends RANK from the environment as a str when torch.distributed is not initialised.
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return None
    return None


def _timeout(value: Any, what: str) -> Timeout:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadRequest(f"{what}: timeout must be a number or None, got {type(value).__name__}")
    value = float(value)
    if math.isnan(value) or value < 0:
        raise BadRequest(f"{what}: invalid timeout {value}")
    return value


def _hb_timeouts(obj: Any) -> Optional[HbTimeouts]:
    if obj is None:
        return None
    if not isinstance(obj, HeartbeatTimeoutsShim):
        raise BadRequest("hb_timeouts is not HeartbeatTimeouts")
    calc = obj.get("were_calculated")
    return HbTimeouts(
        initial=_timeout(obj.get("initial"), "initial"),
        subsequent=_timeout(obj.get("subsequent"), "subsequent"),
        were_calculated=calc if isinstance(calc, bool) else None,
    )


def _sec_timeouts(obj: Any) -> Optional[SecTimeouts]:
    if obj is None:
        return None
    if not isinstance(obj, SectionTimeoutsShim):
        raise BadRequest("section_timeouts is not SectionTimeouts")
    section = obj.get("section") or {}
    if not isinstance(section, dict) or not all(isinstance(k, str) for k in section):
        raise BadRequest("section timeouts must map str to timeout")
    calc = obj.get("calculated_sections") or ()
    if not isinstance(calc, (set, frozenset, list, tuple, dict)):
        raise BadRequest("calculated_sections must be a collection")
    return SecTimeouts(
        section={k: _timeout(v, f"section {k!r}") for k, v in section.items()},
        out_of_section=_timeout(obj.get("out_of_section"), "out_of_section"),
        calculated_sections=tuple(sorted(str(s) for s in calc)),
        is_out_of_section_calculated=bool(obj.get("is_out_of_section_calculated")),
    )


def _interpret(obj: Any) -> Request:
    if isinstance(obj, HeartbeatMsgShim):
        if obj.get("state"):
            return Invalid("state in heartbeat is not supported in this version")
        return Heartbeat()
    if isinstance(obj, SectionMsgShim):
        action, name = obj.get("action"), obj.get("section")
        if action is SectionAction.CLOSE_ALL:
            return SectionCloseAll()
        if not isinstance(name, str):
            raise ProtocolError("section name is not a str")
        if action is SectionAction.OPEN:
            return SectionOpen(name)
        if action is SectionAction.CLOSE:
            return SectionClose(name)
        raise ProtocolError(f"unknown section action {action!r}")
    if isinstance(obj, AuthkeyMsgShim):
        return Authkey()
    if isinstance(obj, InitMsgShim):
        info = obj.get("rank_info")
        if not isinstance(info, RankInfoShim):
            raise ProtocolError("InitMsg without RankInfo")
        host = info.get("host")
        return Init(
            rank=_int_or_none(info.get("global_rank")),
            local_rank=_int_or_none(info.get("local_rank")),
            host=host if isinstance(host, str) else "",
            pid=_int_or_none(info.get("pid")),
        )
    if isinstance(obj, UpdateConfigMsgShim):
        try:
            return UpdateConfig(_hb_timeouts(obj.get("hb_timeouts")), _sec_timeouts(obj.get("section_timeouts")))
        except BadRequest as exc:
            return Invalid(str(exc))
    raise ProtocolError(f"unexpected message type {type(obj).__name__}")


class Decoder:
    """Frame payload -> validated request, memoized by the exact payload bytes.

    A rank's heartbeat frame, and its open/close frame for a given section, are byte-identical every
    time, so after the first one each message costs a dict lookup instead of an unpickle. Requests are
    frozen, so sharing them is safe. Refused payloads are never cached.
    """

    def __init__(self, capacity: int = 512) -> None:
        self._cache: dict[bytes, Request] = {}
        self._capacity = capacity

    def decode(self, payload: bytes) -> Request:
        req = self._cache.get(payload)
        if req is None:
            req = _interpret(unpickle(payload))
            if len(self._cache) >= self._capacity:
                self._cache.clear()  # distinct payloads are few; a flood of unique ones just stays slow
            self._cache[payload] = req
        return req


def decode_workload_request(payload: bytes) -> WorkloadRequest:
    """Decode the launcher-socket message: ``(global_rank, WorkloadControlRequest)``."""
    obj = unpickle(payload)
    if not (isinstance(obj, tuple) and len(obj) == 2 and isinstance(obj[1], WorkloadControlRequestShim)):
        raise ProtocolError("expected (rank, WorkloadControlRequest)")
    action = obj[1].get("action")
    if not isinstance(action, WorkloadAction):
        raise ProtocolError("WorkloadControlRequest without a WorkloadAction")
    description = obj[1].get("description", "<not set>")
    return WorkloadRequest(_int_or_none(obj[0]), action.name, str(description))
