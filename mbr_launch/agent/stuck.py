"""A signal the main thread cannot act on, because it is stuck inside C code.

Python runs a signal handler in the main thread, between two bytecodes. While that thread waits inside a
C++ call that never returns to the interpreter, no handler runs: torch's TCPStore client waiting for a
rendezvous host that is not up yet (up to its 60 s connect timeout, retried by the rendezvous), or a store
call on a link that drops packets. A Ctrl-C there did nothing. CPython's C-level handler does write the
signal's number to the file given to ``signal.set_wakeup_fd``, even then: this watchdog thread reads it,
and when the Python-level handler (``Wakeup.post_signal``) has not seen that signal within ``patience``
seconds, the main thread is stuck and ``on_stuck`` ends the process from here.

Only a store call can block for ever, so ``patience`` applies while the main thread is inside one
(``blocked_in``: the store guard's name for it). Elsewhere the main thread may be slow in C code that returns
(loading a large extension module on a loaded machine took over 1 s in CI, and the watchdog then cut a
Ctrl-C's 20 s grace to nothing): there the watchdog waits ``long_patience``, or ``patience`` after a second
signal the handler has not seen (a second Ctrl-C means "now"). A watched signal also ``nudge``s the main
loop: the kernel may deliver a process's signal to any of its threads, and one taken by another thread does
not interrupt the main thread's ``select``; the nudge wakes it so that the handler runs at once.
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
    ``watched`` signals the Python-level handler has seen so far. Other signals that some Python handler
    catches (a terminal's SIGWINCH, say) are written to the same file and are not counted."""

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
        # CPython runs a handler once for a signal however often it came before the handler ran, so bytes in
        # the file are not handler runs: any run of the handler since the last look means the main thread is
        # alive and has taken every signal that came before it ran. The count is read before the file, so a
        # byte written before a run is never read after that run's count (a signal that comes between the two
        # reads is taken as seen: the next one is caught).
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
        """The watched signals written to the file so far; None once it is closed."""
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
