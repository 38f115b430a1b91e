"""The monitor's frame reader over a real socket pair: frames split anywhere, many in one chunk, bad lengths."""

from __future__ import annotations

import socket
import threading

import pytest

from mbr_launch.monitor.connections import CHUNK, frames
from mbr_launch.monitor.protocol import MAX_FRAME, ProtocolError

pytestmark = pytest.mark.timeout(20)


def _frame(payload: bytes) -> bytes:
    return len(payload).to_bytes(4, "big") + payload


def _read_all(data: bytes, pieces: list[int] | None = None) -> list[bytes]:
    a, b = socket.socketpair()
    with a, b:
        def send() -> None:
            at = 0
            for size in pieces or [len(data)]:
                a.sendall(data[at:at + size])
                at += size
            a.sendall(data[at:])
            a.shutdown(socket.SHUT_WR)

        writer = threading.Thread(target=send)
        writer.start()
        try:
            return list(frames(b))
        finally:
            writer.join()


def test_a_burst_of_frames_and_frames_split_at_every_byte():
    payloads = [bytes([i % 251]) * (1 + i * 37 % 3000) for i in range(300)]  # > CHUNK in all
    data = b"".join(_frame(p) for p in payloads)
    assert len(data) > CHUNK
    assert _read_all(data) == payloads
    small = payloads[:5]
    data = b"".join(_frame(p) for p in small)
    assert _read_all(data, pieces=[1] * len(data)) == small  # one byte at a time: headers split too


def test_a_stream_that_ends_inside_a_frame_is_an_error_and_between_frames_is_not():
    assert _read_all(b"") == []
    with pytest.raises(EOFError):
        _read_all(_frame(b"abc")[:-1])
    with pytest.raises(EOFError):
        _read_all(b"\x00\x00")  # half a header


@pytest.mark.parametrize("length", [0, MAX_FRAME + 1, 2**32 - 1])
def test_a_bad_length_is_refused_before_its_payload_is_awaited(length):
    with pytest.raises(ProtocolError):
        _read_all(length.to_bytes(4, "big") + b"x")
