"""Worker output: each stream copied line by line to its log file and/or the console, with a rank prefix."""

from __future__ import annotations

import collections
import threading
from pathlib import Path
from typing import BinaryIO, Sequence


class OutputPump:
    """Copies one worker stream line by line to a log file and/or the console with a rank prefix."""

    _console_lock = threading.Lock()

    def __init__(self, source: BinaryIO, *, prefix: bytes, console: BinaryIO | None,
                 logfile: Path | None, filters: Sequence[str] = (), filtered: BinaryIO | None = None,
                 tail: collections.deque[bytes] | None = None) -> None:
        self._source = source
        self._prefix = prefix
        self._console = console
        self._logfile = logfile
        self._filters = [f.encode() for f in filters if f]
        self._filtered = filtered
        self._tail = tail  # the stream's last lines, for the agent to read when the worker dies

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self._run, daemon=True, name=f"pump{self._prefix!r}")
        thread.start()
        return thread

    def _run(self) -> None:
        log = open(self._logfile, "ab") if self._logfile else None
        try:
            for line in iter(self._source.readline, b""):
                if self._tail is not None:
                    self._tail.append(line)
                if log:
                    log.write(line)
                    log.flush()
                if self._filtered is not None and any(f in line for f in self._filters):
                    with self._console_lock:
                        self._filtered.write(self._prefix + line)
                        self._filtered.flush()
                if self._console is not None:
                    with self._console_lock:
                        self._console.write(self._prefix + line)
                        self._console.flush()
        except (OSError, ValueError):
            pass
        finally:
            if log:
                log.close()
            self._source.close()
