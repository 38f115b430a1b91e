"""The node-health daemon's side of its one call (``mbr_launch.health.suite``), for a fake daemon."""

from __future__ import annotations

from mbr_launch.health.checks import Reply
from mbr_launch.health.suite import _fields, _string, _varint


def decode_request(data: bytes) -> list[str]:
    return [v.decode(errors="replace") for n, v in _fields(data) if n == 1 and isinstance(v, bytes)]


def encode_reply(reply: Reply) -> bytes:
    out = b""
    if reply.success:
        out += _varint(1 << 3) + _varint(1)
    if reply.exit_code:
        out += _varint(2 << 3) + _varint(reply.exit_code)
    if reply.output:
        out += _string(3, reply.output)
    if reply.error:
        out += _string(4, reply.error)
    return out
