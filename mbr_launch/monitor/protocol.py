"""The NVRx rank-monitor wire protocol (0.4.1, and 0.6 / 0.7), decoded without NVRx and without trusting the peer.

Frames are a 4-byte big-endian length and a pickle, which NVRx unpickles blindly (a code-execution door). Here
``mbr_launch.unpickle`` reads it into inert records of the ``ALLOWED`` classes only, validated into frozen
requests: a malformed frame is a ``ProtocolError`` (drop), a bad value ``Invalid``/``BadRequest`` (answer).
An ``InitMsg`` with ``iteration`` and ``num_warmup_iters`` is from NVRx 0.6+ (``Init.version``).
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Union

from mbr_launch.unpickle.machine import load
from mbr_launch.unpickle.objects import Global, Record
from mbr_launch.unpickle.policy import (BYTES_OPCODES, DATA_OPCODES, OBJECT_OPCODES, SET_OPCODES, TEXT_OPCODES,
                                        PicklePolicy, PickleRefused)

HEADER = struct.Struct(">I")
# A real client message is a few hundred bytes; a state_dict-sized UpdateConfigMsg stays far below this.
MAX_FRAME = 1 << 20
_DATA = "nvidia_resiliency_ext.fault_tolerance.data"


class ProtocolError(Exception):
    """The peer sent something that is not a valid NVRx client message; drop the connection."""


class BadRequest(Exception):
    """A well-formed message with an invalid value: answer ``ErrorMsg`` and keep the connection."""


class SectionAction(enum.Enum):
    OPEN = 1
    CLOSE = 2
    CLOSE_ALL = 3


class WorkloadAction(enum.Enum):
    Continue = 0
    ExcludeThisNode = 1
    ShutdownWorkload = 2


# Exactly what the clients pickle: NVRx's data classes and enums (and sets as pickle protocols 2 and 3 write them).
ALLOWED: frozenset[tuple[str, str]] = frozenset({
    *((_DATA, name) for name in ("AuthkeyMsg", "InitMsg", "RankInfo", "HeartbeatMsg", "SectionMsg", "SectionAction",
                                 "UpdateConfigMsg", "HeartbeatTimeouts", "SectionTimeouts", "WorkloadControlRequest",
                                 "WorkloadAction")),
    ("builtins", "set"), ("builtins", "frozenset"),
})
# What a client frame may hold, bounded far above a real message (under 100 opcodes, 4 levels deep).
FRAMES = PicklePolicy(
    what="pickle frame", opcodes=DATA_OPCODES | OBJECT_OPCODES | SET_OPCODES | BYTES_OPCODES | TEXT_OPCODES,
    unaccepted="is not accepted in a client frame",
    max_ops=20_000, keys=frozenset({str, int, float, bool, type(None), bytes}), keys_why="a key is a plain value",
    globals=ALLOWED, max_int_bits=2048, max_depth=16, max_values=20_000)

# Bounds on values, far above what a real client sends.
MAX_RANK = 1 << 31
MAX_PID = 1 << 31
MAX_NAME = 256  # a section name
MAX_SECTIONS = 1024  # entries of a section-timeout map
MAX_TEXT = 1024  # a host name or a request's description (longer descriptions are cut)
MAX_TIMEOUT = 1e8  # seconds (3 years): longer is a mistake, and epoll cannot wait that long anyway
MAX_ITERATION = 1 << 62  # a training iteration (Megatron's); far beyond any run
MAX_CYCLE = 1 << 31

# The client generations whose rules differ (see ``deadlines``): 0.4.1, and 0.6 / 0.7.
V041 = "0.4.1"
V06 = "0.6+"


def unpickle(payload: bytes) -> Any:
    """The frame's value as inert records (``mbr_launch.unpickle``); any refusal is a ``ProtocolError``."""
    if len(payload) > MAX_FRAME:
        raise ProtocolError(f"frame of {len(payload)} bytes exceeds {MAX_FRAME}")
    try:
        return load(payload, FRAMES)
    except PickleRefused as exc:
        raise ProtocolError(str(exc)) from None


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
    rank: int
    local_rank: int
    host: str
    pid: int
    version: str = V041  # V041 or V06: which NVRx generation's rules and config the client gets
    iteration: Optional[int] = None  # 0.6+: the training iteration at init (Megatron), else None
    num_warmup_iters: Optional[int] = None  # 0.6+: overrides the config's num_warmup_iterations


@dataclass(frozen=True, slots=True)
class Heartbeat:
    pass


@dataclass(frozen=True, slots=True)
class SectionOpen:
    name: str
    iteration: Optional[int] = None  # 0.6+: the training iteration the client reports (Megatron), else None


@dataclass(frozen=True, slots=True)
class SectionClose:
    name: str
    iteration: Optional[int] = None


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
    current_cycle: Optional[int] = None  # 0.6+: NVRx's launcher tells its monitor the cycle; logged only


@dataclass(frozen=True, slots=True)
class Invalid:
    """Decodes fine but cannot be honoured: answered ``ErrorMsg(cause)`` unless ``oneway`` to a quiet client."""

    cause: str
    oneway: bool = False


@dataclass(frozen=True, slots=True)
class WorkloadControlRequest:
    rank: int
    action: str
    description: str


Request = Union[Authkey, Init, Heartbeat, SectionOpen, SectionClose, SectionCloseAll, UpdateConfig, Invalid]


# ---- validation: records -> requests ------------------------------------------------------------------


def _integer(value: Any, what: str, low: int, high: int) -> int:
    """An int in [low, high); a decimal string counts (a client without torch.distributed sends RANK as one)."""
    if isinstance(value, str) and len(value) <= 12:
        try:
            value = int(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"{what} must be an integer, got {_kind(value)}")
    if not low <= value < high:
        raise BadRequest(f"{what} {value} is out of range")
    return value


def _text(value: Any, what: str, limit: int) -> str:
    if not isinstance(value, str):
        raise BadRequest(f"{what} must be a str, got {_kind(value)}")
    if len(value) > limit:
        raise BadRequest(f"{what} is longer than {limit} characters")
    return value


def _kind(value: Any) -> str:
    if isinstance(value, Record):
        return value.cls.name
    return type(value).__name__


def _timeout(value: Any, what: str) -> Timeout:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadRequest(f"{what}: timeout must be a number or None, got {_kind(value)}")
    # Compare before float(): float() of a huge int raises OverflowError.
    if not (0 <= value <= MAX_TIMEOUT):  # NaN fails this too
        raise BadRequest(f"{what}: timeout {value!r:.40} is not between 0 and {MAX_TIMEOUT:g} s")
    return float(value)


def _fields(obj: Any, name: str) -> dict[str, Any]:
    """The state of a record of class ``name`` made with no arguments (how dataclasses are pickled)."""
    if not isinstance(obj, Record) or obj.cls.name != name or obj.cls.module != _DATA:
        raise ProtocolError(f"expected {name}, got {_kind(obj)}")
    state = obj.state
    if isinstance(state, tuple) and len(state) == 2 and state[1] is None:
        state = state[0]  # (dict_state, slot_state) form
    if obj.args != () or not isinstance(state, dict):
        raise ProtocolError(f"{name}: unexpected pickled form")
    return state


def _member(obj: Any, kind: type[enum.Enum]) -> Any:
    """Our own member of ``kind`` for a pickled ``kind(value)``: looked up by value, nothing built."""
    if not isinstance(obj, Record) or obj.cls != Global(_DATA, kind.__name__):
        raise ProtocolError(f"expected a {kind.__name__}, got {_kind(obj)}")
    if obj.built or len(obj.args) != 1 or type(obj.args[0]) is not int:
        raise ProtocolError(f"{kind.__name__}: unexpected pickled form")
    try:
        return kind(obj.args[0])
    except ValueError:
        raise ProtocolError(f"unknown {kind.__name__} {obj.args[0]}") from None


def _rank(value: Any, what: str = "rank") -> int:
    return _integer(value, what, 0, MAX_RANK)


def _hb_timeouts(obj: Any) -> Optional[HbTimeouts]:
    if obj is None:
        return None
    fields = _fields(obj, "HeartbeatTimeouts")
    calc = fields.get("were_calculated")
    return HbTimeouts(
        initial=_timeout(fields.get("initial"), "initial"),
        subsequent=_timeout(fields.get("subsequent"), "subsequent"),
        were_calculated=calc if isinstance(calc, bool) else None,
    )


def _sec_timeouts(obj: Any) -> Optional[SecTimeouts]:
    if obj is None:
        return None
    fields = _fields(obj, "SectionTimeouts")
    section = fields.get("section") or {}
    calc = fields.get("calculated_sections") or ()
    if not isinstance(section, dict) or not isinstance(calc, (set, frozenset, list, tuple, dict)):
        raise BadRequest("section timeouts must map str to timeout, calculated_sections must be a collection")
    if len(section) > MAX_SECTIONS or len(calc) > MAX_SECTIONS:
        raise BadRequest(f"more than {MAX_SECTIONS} sections")
    return SecTimeouts(
        section={_text(k, "section name", MAX_NAME): _timeout(v, f"section {k!r}") for k, v in section.items()},
        out_of_section=_timeout(fields.get("out_of_section"), "out_of_section"),
        calculated_sections=tuple(sorted(_text(s, "section name", MAX_NAME) for s in calc)),
        is_out_of_section_calculated=fields.get("is_out_of_section_calculated") is True,
    )


def _optional_int(value: Any, what: str, high: int) -> Optional[int]:
    """None, or an int in [0, high): an iteration, a warm-up count, a cycle."""
    return None if value is None else _integer(value, what, 0, high)


def _section(fields: dict[str, Any]) -> Request:
    _rank(fields.get("rank"))
    action = _member(fields.get("action"), SectionAction)
    if action is SectionAction.CLOSE_ALL:
        return SectionCloseAll()  # a 0.6+ client sends section None here
    name = _text(fields.get("section"), "section name", MAX_NAME)
    iteration = _optional_int(fields.get("iteration"), "iteration", MAX_ITERATION)
    return SectionOpen(name, iteration) if action is SectionAction.OPEN else SectionClose(name, iteration)


def _init(fields: dict[str, Any]) -> Request:
    info = _fields(fields.get("rank_info"), "RankInfo")
    host = info.get("host")
    newer = "num_warmup_iters" in fields or "iteration" in fields
    return Init(
        rank=_rank(info.get("global_rank")),
        local_rank=_integer(info.get("local_rank"), "local_rank", -1, MAX_RANK),  # -1: LOCAL_RANK unset
        host="" if host is None else _text(host, "host", MAX_TEXT),
        pid=_integer(info.get("pid"), "pid", 1, MAX_PID),
        version=V06 if newer else V041,
        iteration=_optional_int(fields.get("iteration"), "iteration", MAX_ITERATION),
        num_warmup_iters=_optional_int(fields.get("num_warmup_iters"), "num_warmup_iters", MAX_ITERATION),
    )


def _interpret(obj: Any) -> Request:
    kind = obj.cls.name if isinstance(obj, Record) else ""
    try:
        if kind == "HeartbeatMsg":
            fields = _fields(obj, kind)
            _rank(fields.get("rank"))
            if fields.get("state"):
                return Invalid("state in heartbeat is not supported in this version", oneway=True)
            return Heartbeat()
        if kind == "SectionMsg":
            return _section(_fields(obj, kind))
        if kind == "AuthkeyMsg":
            _fields(obj, kind)
            return Authkey()
        if kind == "InitMsg":
            return _init(_fields(obj, kind))
        if kind == "UpdateConfigMsg":
            fields = _fields(obj, kind)
            return UpdateConfig(_hb_timeouts(fields.get("hb_timeouts")), _sec_timeouts(fields.get("section_timeouts")),
                                _optional_int(fields.get("current_cycle"), "current_cycle", MAX_CYCLE))
    except BadRequest as exc:
        return Invalid(f"{kind}: {exc}", oneway=kind in ("HeartbeatMsg", "SectionMsg"))
    raise ProtocolError(f"unexpected message type {_kind(obj)}")


class Decoder:
    """Frame payload -> validated request, memoized by the exact payload bytes (a rank's heartbeat and section
    frames repeat byte for byte); requests are frozen, refused payloads never cached."""

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


def decode_workload_request(payload: bytes) -> WorkloadControlRequest:
    """Decode the launcher-socket message ``(global_rank, WorkloadControlRequest)``."""
    obj = unpickle(payload)
    if not (isinstance(obj, tuple) and len(obj) == 2):
        raise ProtocolError("expected (rank, WorkloadControlRequest)")
    fields = _fields(obj[1], "WorkloadControlRequest")
    action = _member(fields.get("action"), WorkloadAction)
    description = fields.get("description", "<not set>")
    if not isinstance(description, str):
        raise BadRequest(f"description must be a str, got {_kind(description)}")
    if len(description) > MAX_TEXT:
        description = description[:MAX_TEXT] + "..."
    return WorkloadControlRequest(_rank(obj[0]), action.name, description)
