"""The main thread's ``epoll`` and the sockets it watches.

Stream listeners (one per armed rank, plus the launcher socket for workload requests) and the datagram
sockets that receive automatic step beats. Every socket lives in the agent's private directory (checked at
``configure``) with mode 0600; a stale file of an earlier monitor there is replaced.
"""

from __future__ import annotations

import os
import select
import socket
from typing import Optional

from mbr_launch.monitor.state import Slot


class Sockets:
    def __init__(self, wake_r: int) -> None:
        self.ep = select.epoll()
        self.ep.register(wake_r, select.EPOLLIN)
        self.listeners: dict[int, tuple[socket.socket, Optional[Slot]]] = {}  # fd -> (socket, rank or launcher)
        self.step_socks: dict[int, Slot] = {}  # fd -> rank

    def watch(self, fd: int) -> None:
        self.ep.register(fd, select.EPOLLIN)

    def unwatch(self, fd: int) -> None:
        self.ep.unregister(fd)

    def poll(self, timeout: float) -> list[tuple[int, int]]:
        return self.ep.poll(timeout)

    def listen(self, path: str, slot: Optional[Slot]) -> socket.socket:
        unlink(path)  # a stale socket from an earlier monitor: the directory is private to the agent
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(path)
        os.chmod(path, 0o600)
        sock.listen(64)
        sock.setblocking(False)
        self.listeners[sock.fileno()] = (sock, slot)
        self.ep.register(sock.fileno(), select.EPOLLIN)
        return sock

    def unlisten(self, slot: Slot) -> None:
        assert slot.listener is not None
        self.listeners.pop(slot.listener.fileno(), None)
        self.ep.unregister(slot.listener.fileno())
        slot.listener.close()
        unlink(slot.path)
        slot.listener = None

    def open_steps(self, slot: Slot, path: str) -> None:
        unlink(path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)
        sock.bind(path)
        os.chmod(path, 0o600)
        slot.step_sock, slot.step_path = sock, path
        self.step_socks[sock.fileno()] = slot
        self.ep.register(sock.fileno(), select.EPOLLIN)

    def close_steps(self, slot: Slot) -> None:
        assert slot.step_sock is not None
        self.step_socks.pop(slot.step_sock.fileno(), None)
        try:
            self.ep.unregister(slot.step_sock.fileno())
        except (OSError, ValueError):
            pass
        slot.step_sock.close()
        unlink(slot.step_path)
        slot.step_sock, slot.step_path = None, ""

    def close_slot(self, slot: Slot) -> None:
        if slot.listener is not None:
            self.unlisten(slot)
        if slot.step_sock is not None:
            self.close_steps(slot)

    def close_listeners(self) -> None:
        """Close the listeners no rank owns (the launcher socket's); the caller unlinks their paths."""
        for sock, _ in list(self.listeners.values()):
            sock.close()
        self.listeners.clear()

    def close(self) -> None:
        self.ep.close()


def unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def drain(fd: int) -> None:
    """Empty a non-blocking pipe (the wake-up pipe: its bytes carry no meaning)."""
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass
