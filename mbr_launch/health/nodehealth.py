"""The node-health daemon's one call, as ft_launcher 0.7 makes it (``--ft-node-health-check-endpoint``).

``HealthCheckRequest{repeated string args = 1}`` -> ``HealthCheckResponse{bool success = 1; int32 exit_code = 2;
string output = 3; string error = 4}``, encoded here (four fields: no protobuf package); the call goes through
grpcio, imported only when the daemon's socket exists.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

METHOD = "/nvhcd.HealthCheckService/RunHealthCheck"
DEFAULT_ARGS = ("--no-slurm", "--group", "prolog", "epilog", "logs", "gpu")
TIMEOUT = 60.0  # seconds for the daemon's answer (NVRx's request_timeout_sec): it runs a script


@dataclass(frozen=True)
class Reply:
    success: bool = False
    exit_code: int = 0
    output: str = ""
    error: str = ""


def socket_path(endpoint: str) -> str | None:
    """The socket of ``unix:///path``, ``/path`` or ``./path``; None for anything else (not supported)."""
    if endpoint.startswith("unix://"):
        return endpoint[len("unix://"):] or None
    if endpoint.startswith(("/", "./")):
        return endpoint
    return None


# ---- the two messages (protobuf wire format: varint keys, varints and length-delimited strings) ----------

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


# ---- the call --------------------------------------------------------------------------------------------

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
