"""How the supervisor loop sleeps and is woken.

Threads ``post`` typed events; signal handlers only append the signal number to their own queue (no logging,
no locks: gunicorn's rule). Both write a byte to a pipe, so one ``select`` over it and the pidfds wakes the loop.
"""

from __future__ import annotations

import collections
import contextlib
import os
import queue
import time
from typing import Callable, Iterator, Sequence

from mbr_launch.agent.messages import Event
from mbr_launch.fdwait import ready


class Interrupted(BaseException):
    """A signal arrived inside ``Wakeup.interruptible``; a BaseException, so ``except Exception`` lets it by."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class Wakeup:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._interruptible = False
        self._events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        # A deque: append and popleft are atomic, so a signal handler may append while the loop reads.
        self._signals: collections.deque[int] = collections.deque()
        self.received = 0  # signals seen by the handler so far (``agent.stuck`` compares it with the C level's)
        self._read_fd, self._write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def post(self, event: Event) -> None:
        """Thread-safe: queue an event and wake the loop."""
        self._events.put(event)
        self._poke()

    def post_signal(self, signum: int) -> None:
        """Safe in a signal handler: record the signal, wake the loop; inside ``interruptible``, raise."""
        self._signals.append(signum)
        self.received += 1
        self._poke()
        if self._interruptible:
            self._interruptible = False
            raise Interrupted(signum)

    @contextlib.contextmanager
    def interruptible(self) -> Iterator[None]:
        """For a blocking call that cannot wait on the pipe (torch's rendezvous): a signal cuts it short."""
        if self._signals:
            raise Interrupted(self._signals[0])
        self._interruptible = True
        try:
            yield
        finally:
            self._interruptible = False

    def nudge(self) -> None:
        """Thread-safe: wake the loop with nothing queued (for a signal another thread took)."""
        self._poke()

    def _poke(self) -> None:
        try:
            os.write(self._write_fd, b"\0")
        except OSError:
            pass  # the pipe is full (the loop is already due to wake) or closed at exit

    def pending_signal(self) -> int | None:
        return self._signals[0] if self._signals else None

    def pending_signals(self) -> tuple[int, ...]:
        return tuple(self._signals)

    def take_signal(self) -> int | None:
        try:
            return self._signals.popleft()
        except IndexError:
            return None

    def take_events(self) -> list[Event]:
        events = []
        while True:
            try:
                events.append(self._events.get_nowait())
            except queue.Empty:
                return events

    def wait(self, fds: Sequence[int], timeout: float | None) -> list[int]:
        """Block until an event, a signal or one of ``fds`` is ready (or ``timeout``); the ready ``fds``."""
        if self._signals or self._events.qsize():
            timeout = 0
        return self._select(fds, timeout)

    def _select(self, fds: Sequence[int], timeout: float | None) -> list[int]:
        woke = ready([self._read_fd, *fds], timeout)
        if self._read_fd in woke:
            try:
                while os.read(self._read_fd, 4096):
                    pass
            except BlockingIOError:
                pass
        return [fd for fd in woke if fd != self._read_fd]

    def sleep(self, seconds: float) -> bool:
        """A back-off that a signal interrupts; False when a signal arrived."""
        deadline = self.clock() + seconds
        while (remaining := deadline - self.clock()) > 0 and not self._signals:
            self._select((), remaining)  # events posted meanwhile wait in their queue
        return not self._signals

    def close(self) -> None:
        for fd in (self._read_fd, self._write_fd):
            try:
                os.close(fd)
            except OSError:
                pass
