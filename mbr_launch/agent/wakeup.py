"""How the supervisor loop sleeps and is woken, and the watchdog of signals it cannot take (``StuckSignals``).

Threads ``post`` typed events; signal handlers only append the signal number to their own queue (no logging,
no locks: gunicorn's rule). Both write a byte to a pipe, so one ``select`` over it and the pidfds wakes the loop.
"""

from __future__ import annotations

import collections
import contextlib
import os
import queue
import signal
import threading
import time
from typing import Callable, Iterable, Iterator, Sequence

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
        self.received = 0  # signals seen by the handler so far (``StuckSignals`` compares it with the C level's)
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
            with contextlib.suppress(BlockingIOError):
                while os.read(self._read_fd, 4096):
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
            with contextlib.suppress(OSError):
                os.close(fd)


PATIENCE = 1.0  # seconds: a main thread in Python code runs the handler within milliseconds
LONG_PATIENCE = 10.0  # seconds: outside a store call, before a single unseen signal ends the run


class StuckSignals:
    """A signal the main thread cannot act on, stuck in C code (torch's store client connecting to a host not up
    yet, a store call on a cut link): CPython's C-level handler still writes its number to ``set_wakeup_fd``'s
    file. This thread reads it, and when the Python handler (``handled()``: how many of the ``watched`` it saw)
    has not seen it within ``patience`` (inside a store call, the only one that can block for ever) or
    ``long_patience`` (elsewhere, short of a second signal), ``on_stuck`` ends the process. A watched signal
    also ``nudge``s the loop: one taken by another thread does not wake ``select``. Started and closed on the
    main thread (``set_wakeup_fd`` must be)."""

    def __init__(self, watched: Iterable[int], handled: Callable[[], int], on_stuck: Callable[[int], None], *,
                 blocked_in: Callable[[], str | None] = lambda: "", nudge: Callable[[], None] = lambda: None,
                 patience: float = PATIENCE, long_patience: float = LONG_PATIENCE) -> None:
        self._watched = frozenset(int(sig) for sig in watched)
        self._handled, self._on_stuck, self._patience = handled, on_stuck, patience
        self._blocked_in, self._nudge, self._long_patience = blocked_in, nudge, long_patience
        self._read_fd, self._write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._old_fd = -1
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stuck-signals", daemon=True)

    def start(self) -> "StuckSignals":
        self._old_fd = signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        self._thread.start()
        return self

    def _run(self) -> None:
        # A handler runs once for a signal however often it came, so any run since the last look means every
        # signal before it was taken. The count is read before the file, so no byte is read after its run.
        pending, last, unseen_since, last_handled = 0, 0, None, self._handled()
        while not self._closed.is_set():
            ready([self._read_fd], 0.25)
            handled = self._handled()
            ours = self._drain()  # whether or not select saw it: a byte may have come since it returned
            if ours is None:
                return
            if ours:
                self._nudge()
            last = ours[-1] if ours else last
            pending += len(ours)
            if handled != last_handled:
                pending, last_handled, unseen_since = 0, handled, None
            if not pending:
                continue
            if unseen_since is None:
                unseen_since = time.monotonic()
                continue
            waited = time.monotonic() - unseen_since
            patience = self._patience if pending > 1 or self._blocked_in() is not None else self._long_patience
            if waited >= patience and not self._closed.is_set():
                self._on_stuck(last)
                return

    def _drain(self) -> list[int] | None:
        ours: list[int] = []
        while True:
            try:
                data = os.read(self._read_fd, 512)
            except BlockingIOError:
                return ours
            except OSError:  # closed at exit
                return None
            if not data:
                return ours
            ours += [signum for signum in data if signum in self._watched]

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(ValueError):  # not on the main thread (never, as the agent uses it)
            signal.set_wakeup_fd(self._old_fd)
        self._thread.join(1.0)
        for fd in (self._read_fd, self._write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
