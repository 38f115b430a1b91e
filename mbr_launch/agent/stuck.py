"""A signal the main thread cannot act on, because it is stuck inside C code.

Python runs signal handlers in the main thread between bytecodes: while it waits in a C++ call (torch's
store client connecting to a host not up yet, a store call on a cut link) a Ctrl-C did nothing. CPython's
C-level handler still writes the signal's number to ``signal.set_wakeup_fd``'s file: this watchdog reads it,
and when the Python handler has not seen the signal within ``patience`` (inside a store call, the only one
that can block for ever) or ``long_patience`` (elsewhere, short of a second signal), ``on_stuck`` ends the
process. A watched signal also ``nudge``s the loop: one taken by another thread does not wake ``select``.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Callable, Iterable

from mbr_launch.fdwait import ready

PATIENCE = 1.0  # seconds: a main thread in Python code runs the handler within milliseconds
LONG_PATIENCE = 10.0  # seconds: outside a store call, before a single unseen signal ends the run


class StuckSignals:
    """Started and closed on the main thread (``set_wakeup_fd`` must be); ``handled()``: how many of the
    ``watched`` signals the Python handler has seen so far."""

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
        try:
            signal.set_wakeup_fd(self._old_fd)
        except ValueError:  # not on the main thread (never, as the agent uses it)
            pass
        self._thread.join(1.0)
        for fd in (self._read_fd, self._write_fd):
            try:
                os.close(fd)
            except OSError:
                pass
