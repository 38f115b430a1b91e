"""Worker output: each stream copied line by line to its log file and/or the console, with a rank prefix.

The pump never stops reading before the worker's end of the pipe closes: a worker whose pipe is not
drained blocks in ``write`` and the job freezes. A log file that fails (disk full, I/O error) is given up
with its complete lines kept; from then on the stream goes to the console (where it was not already)
and what the file missed is counted. A console that fails (a closed terminal) is dropped the same way.
"""

from __future__ import annotations

import collections
import threading
from pathlib import Path
from typing import BinaryIO, Callable, Sequence

from mbr_launch.report.appender import LineAppender


def prefixed(prefix: bytes, line: bytes) -> bytes:
    """``line`` with the rank prefix, once: once a process group exists torch starts lines of its own with the
    same ``[rankN]:`` (its logging handler: TORCH_LOGS, dynamo's warnings)."""
    return line if line.startswith(prefix) else prefix + line


class OutputPump:
    """Copies one worker stream line by line to a log file and/or the console with a rank prefix.

    ``fallback`` is the console the stream switches to when its log file fails (None: the lines are only
    counted); ``on_log_failure`` is told once, at the first failure, and ``on_done`` when the stream ends
    (both on the pump's thread: they must be quick and thread-safe)."""

    _console_lock = threading.Lock()

    def __init__(self, source: BinaryIO, *, prefix: bytes, console: BinaryIO | None,
                 logfile: Path | None, filters: Sequence[str] = (), filtered: LineAppender | None = None,
                 tail: collections.deque[bytes] | None = None, fallback: BinaryIO | None = None,
                 on_log_failure: Callable[["OutputPump", LineAppender], None] | None = None,
                 on_done: Callable[["OutputPump"], None] | None = None,
                 appender: Callable[[Path], LineAppender] = LineAppender) -> None:
        self._source = source
        self.prefix = prefix
        self._console = console
        self._fallback = fallback
        self.logfile = logfile
        self.log: LineAppender | None = None  # opened on the pump's thread: opening may be slow or fail
        self._filters = [f.encode() for f in filters if f]
        self._filtered = filtered
        self._tail = tail  # the stream's last lines, for the agent to read when the worker dies
        self._on_log_failure = on_log_failure
        self._on_done = on_done
        self._appender = appender  # tests give one whose writes fail the way a disk rarely does (EIO)
        self._told: set[int] = set()  # the appenders whose failure was told

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self._run, daemon=True, name=f"pump{self.prefix!r}")
        thread.start()
        return thread

    def _run(self) -> None:
        try:
            self.log = self._appender(self.logfile) if self.logfile else None
            if self.log is not None and not self.log.ok:
                self._log_failed(self.log)
            for line in iter(self._source.readline, b""):
                self._deliver(line)
        except (OSError, ValueError):
            pass  # the pipe itself failed: there is nothing left to drain
        finally:
            if self.log is not None:
                self.log.close()
            try:
                self._source.close()
            except (OSError, ValueError):
                pass
            if self._on_done is not None:
                self._on_done(self)

    def _deliver(self, line: bytes) -> None:
        if self._tail is not None:
            self._tail.append(line)
        if self.log is not None and not self.log.append(line):
            self._log_failed(self.log)
        if self._filtered is not None and any(f in line for f in self._filters):
            with self._console_lock:
                if not self._filtered.append(prefixed(self.prefix, line)):
                    self._log_failed(self._filtered)
        if self._console is not None:
            with self._console_lock:
                try:
                    self._console.write(prefixed(self.prefix, line))
                    self._console.flush()
                except (OSError, ValueError):
                    self._console = None  # a closed terminal: keep draining, show nothing more

    def _log_failed(self, log: LineAppender) -> None:
        if id(log) in self._told:
            return
        self._told.add(id(log))
        if log is self.log and self._console is None:
            self._console = self._fallback
        if self._on_log_failure is not None:
            try:
                self._on_log_failure(self, log)
            except (OSError, ValueError):
                pass  # the warning could not be shown (the console is gone too): keep draining
