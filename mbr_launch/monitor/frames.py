"""Length-prefixed frames off a client's stream socket, read in chunks.

An NVRx 0.6+ client sends heartbeats and sections without waiting for a reply, so a burst of them queues up in
the socket: one ``recv`` of up to ``CHUNK`` bytes takes many frames at once, where reading each frame's header
and payload exactly costs two system calls a message. A request-reply client (0.4.1) has one frame in flight,
and this reads it as the exact reads did. A frame's length is checked (``protocol.frame_length``) before its
payload is waited for, so the buffer never holds more than one maximal frame beyond a chunk.
"""

from __future__ import annotations

import socket
from typing import Iterator

from mbr_launch.monitor.protocol import HEADER, frame_length

CHUNK = 64 * 1024


def frames(sock: socket.socket) -> Iterator[bytes]:
    """Each frame's payload until the peer closes between frames; ``EOFError`` when it closes inside one,
    ``protocol.ProtocolError`` on a bad length, ``OSError`` from the socket."""
    buf = bytearray()
    start = 0  # where the next frame begins in ``buf``
    while True:
        while len(buf) - start < HEADER.size:
            if not _fill(sock, buf, at_boundary=len(buf) == start):
                return
        end = start + HEADER.size + frame_length(bytes(buf[start:start + HEADER.size]))
        while len(buf) < end:
            _fill(sock, buf, at_boundary=False)
        yield bytes(buf[start + HEADER.size:end])
        start = end
        if start == len(buf):
            buf.clear()
            start = 0
        elif start >= CHUNK:  # keep the unread tail only: the buffer stays about a chunk long
            del buf[:start]
            start = 0


def _fill(sock: socket.socket, buf: bytearray, *, at_boundary: bool) -> bool:
    """Append what the socket has (waiting for at least a byte); False at a clean end of the stream."""
    data = sock.recv(CHUNK)
    if not data:
        if at_boundary:
            return False
        raise EOFError
    buf += data
    return True
