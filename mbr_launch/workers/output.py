"""Worker output: each stream copied as it comes to its log file and/or the console, with a rank prefix.

What the user sees is in docs/console.md. The pump never stops reading before the worker's end of the pipe
closes (an undrained worker blocks in ``write`` and the job freezes), and memory stays bounded whatever a
worker writes (``LINE_CAP``). A log file that fails is given up with its complete lines kept; the stream then
goes to the console and what the file missed is counted. A console that fails is dropped the same way.
"""

from __future__ import annotations

import codecs
import collections
import os
import re
import select
import string
import threading
from pathlib import Path
from typing import BinaryIO, Callable, Protocol, Sequence

from mbr_launch.report.appender import LineAppender
from mbr_launch.report.console import ConsoleSource
from mbr_launch.visible import visible

CHUNK = 64 * 1024  # one read; also the batch after which the log file is written even while more is ready
LINE_CAP = 64 * 1024  # the longest line kept whole (tail, filters) or held back for the log file

# Worker bytes that need no look on a terminal: printable ASCII, tab, \r and \n.
_PLAIN = re.compile(rb"[\t\n\r\x20-\x7e]*")
# What a worker may send a terminal as it is: SGR colours and attributes, and ``ESC [ K`` (progress bars erase
# their line after \r; the cursor is past the prefix then). The split keeps them, \r and \n as pieces.
_KEPT = re.compile(r"(\x1b\[[0-9;:]{0,32}m|\x1b\[0?K|[\r\n])")
# The start of an SGR at the end of a chunk: held until the next chunk completes it (or shows it as escaped).
_SGR_START = re.compile(r"\x1b(?:\[[0-9;:]{0,32})?\Z")
_RESET = "\x1b[0m"
# Characters of SGR applied again after each line start: bounded, so a short line costs little more than written.
_SGR_KEPT = 128


class ForTerminal:
    """A worker's stream made safe for a terminal, chunk by chunk: colours kept, every other control shown escaped.
    Colours are reset at each line (and chunk) end and applied again after the next prefix, which a worker thus
    cannot conceal; non-UTF-8 bytes show as ``\\xNN`` (a C1 byte is a control to some terminals)."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")("backslashreplace")
        self._held = ""  # an SGR cut by the chunk's end
        self._sgr: list[str] = []  # the SGR sequences in effect (since the last reset)
        self._again = False  # a line start (or a chunk) came since the colours were reset: apply them before text

    def shown(self, data: bytes, final: bool = False) -> bytes:
        """What of ``data`` a terminal may get; ``final``: the stream ended (what was held back is shown now)."""
        if not self._held and not self._sgr and _PLAIN.fullmatch(data) and not self._decoder.getstate()[0]:
            return data  # the common case: plain ASCII lines, at the speed of one regex over the bytes
        text = self._held + self._decoder.decode(data, final)
        held = None if final else _SGR_START.search(text)
        self._held = held.group() if held else ""
        if held:
            text = text[: held.start()]
        if not self._sgr and "\x1b" not in text:  # text that is not all ASCII: whole, between its \r
            return "\r".join(map(visible, text.split("\r"))).encode()
        out: list[str] = []
        for piece in _KEPT.split(text):
            if piece in ("\r", "\n"):
                if self._sgr and not self._again:
                    out.append(_RESET)
                    self._again = True
                out.append(piece)
            elif piece:
                if self._again:
                    out.extend(self._sgr)
                    self._again = False
                if piece.startswith("\x1b[") and _KEPT.fullmatch(piece):
                    if piece.endswith("m"):
                        self._keep(piece)
                    out.append(piece)
                else:
                    out.append(piece if piece.isprintable() else visible(piece))
        if self._sgr and not self._again:
            out.append(_RESET)
            self._again = True
        return "".join(out).encode()

    def _keep(self, sgr: str) -> None:
        params = sgr[2:-1].split(";")
        if params[0] in ("", "0"):  # a reset, perhaps followed by new attributes
            self._sgr.clear()
            if all(p in ("", "0") for p in params):
                return
        self._sgr.append(sgr)
        while sum(map(len, self._sgr)) > _SGR_KEPT:
            del self._sgr[0]


class Mirror(Protocol):
    """Where else a stream goes, as it comes (``workers.cyclelog.CycleSink``); must never raise."""

    def write(self, data: bytes) -> None: ...
    def close(self) -> None: ...


def rank_prefix(template: str, *, rank: int, local_rank: int, role: str, hostname: str) -> bytes:
    """``[rankN]:``, or --log-line-prefix-template filled in as torch 2.14 does (``string.Template``)."""
    if not template:
        return f"[rank{rank}]:".encode()
    return string.Template(template).safe_substitute(
        role_name=role, rank=rank, local_rank=local_rank, hostname=hostname).encode(errors="replace")


def prefixed(prefix: bytes, line: bytes) -> bytes:
    """``line`` with the rank prefix, once: torch starts some lines with the same ``[rankN]:`` itself."""
    return line if line.startswith(prefix) else prefix + line


class OutputPump:
    """Copies one worker stream to a log file and/or the console (a ``ConsoleSource`` that adds the rank prefix).
    ``fallback``: the console used once the log file fails; ``on_log_failure`` (once) and ``on_done`` run on
    the pump's thread."""

    _filter_lock = threading.Lock()  # the filtered files are shared by the pumps of all ranks

    def __init__(self, source: BinaryIO, *, prefix: bytes, console: ConsoleSource | None,
                 logfile: Path | None, filters: Sequence[str] = (), filtered: LineAppender | None = None,
                 tail: collections.deque[bytes] | None = None, fallback: ConsoleSource | None = None,
                 on_log_failure: Callable[["OutputPump", LineAppender], None] | None = None,
                 on_done: Callable[["OutputPump"], None] | None = None,
                 appender: Callable[[Path], LineAppender] = LineAppender, mirror: Mirror | None = None) -> None:
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
        self._mirror = mirror  # another copy of the stream as it comes (the per-cycle log)
        self._told: set[int] = set()  # the appenders whose failure was told
        self._pending_log = bytearray()  # read, not yet in the log file
        self._line = bytearray()  # the unfinished line, cut at LINE_CAP (for the tail and the filters)
        self._for_terminal = ForTerminal()

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self._run, daemon=True, name=f"pump{self.prefix!r}")
        thread.start()
        return thread

    def _run(self) -> None:
        try:
            self.log = self._appender(self.logfile) if self.logfile else None
            if self.log is not None and not self.log.ok:
                self._log_failed(self.log)
            fd = self._source.fileno()
            ready = select.poll()
            ready.register(fd, select.POLLIN)
            while data := os.read(fd, CHUNK):
                self._take(data)
                if len(self._pending_log) >= CHUNK or not ready.poll(0):
                    self._write_log(final=False)
                    if self._console is not None:
                        self._console.flush()
        except (OSError, ValueError):
            pass  # the pipe itself failed: there is nothing left to drain
        finally:
            self._finish()

    def _take(self, data: bytes) -> None:
        if self._console is not None and not self._show(data):
            self._console = None  # a closed terminal: keep draining, show nothing more
        if self.log is not None:
            self._pending_log += data
        if self._mirror is not None:
            self._mirror.write(data)
        if self._tail is not None or self._filters:
            self._lines(data)

    def _show(self, data: bytes, *, final: bool = False) -> bool:
        """``data`` to the console, on a terminal as ``ForTerminal`` passes it; False once the console is gone."""
        assert self._console is not None
        if self._console.console.is_terminal(self._console.stream):
            data = self._for_terminal.shown(data, final)
        return not data or self._console.write(data)

    def _finish(self) -> None:
        if self._line:
            self._complete(bytes(self._line) + b"\n")  # the last line had no end; it counts all the same
            self._line.clear()
        self._write_log(final=True)
        if self._console is not None:
            self._show(b"", final=True)  # an escape or a character that the stream's end cut
        for console in dict.fromkeys((self._console, self._fallback)):
            if console is not None:
                console.end()
        if self.log is not None:
            self.log.close()
        if self._mirror is not None:
            self._mirror.close()
        try:
            self._source.close()
        except (OSError, ValueError):
            pass
        if self._on_done is not None:
            self._on_done(self)

    # ---- the log file: whole lines ----------------------------------------------------------------

    def _write_log(self, *, final: bool) -> None:
        buf = self._pending_log
        if self.log is None or not buf:
            return
        cut = len(buf) if final else buf.rfind(b"\n") + 1
        if not cut and len(buf) >= LINE_CAP:
            cut = len(buf)  # a line without end: written on in pieces, never held whole
        if not cut:
            return
        piece = bytes(buf[:cut])
        del buf[:cut]
        shown = self._console is not None
        if not self.log.append(piece):
            self._log_failed(self.log)
            if not shown and self._console is not None:  # what the file refused shows on the fallback console
                self._show(piece + bytes(buf))

    # ---- lines: the tail and the filters ------------------------------------------------------------

    def _lines(self, data: bytes) -> None:
        last = data.rfind(b"\n")
        if last < 0:
            self._keep(data)
            return
        block = bytes(self._line) + data[: last + 1]
        self._line.clear()
        self._keep(data[last + 1:])
        self._complete(block)

    def _keep(self, piece: bytes) -> None:
        room = LINE_CAP - len(self._line)
        if room > 0:
            self._line += piece[:room]

    def _complete(self, block: bytes) -> None:
        """``block``: whole lines, each ending with \\n."""
        if self._filtered is not None and any(f in block for f in self._filters):
            hits = b"".join(prefixed(self.prefix, line[:LINE_CAP]) + b"\n" for line in block[:-1].split(b"\n")
                            if any(f in line for f in self._filters))
            with self._filter_lock:
                if hits and not self._filtered.append(hits):
                    self._log_failed(self._filtered)
        if self._tail is not None and self._tail.maxlen != 0:
            keep = self._tail.maxlen or block.count(b"\n")
            lines = block[:-1].rsplit(b"\n", keep)
            self._tail.extend(_for_tail(line) for line in lines[-keep:])

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


def _for_tail(line: bytes) -> bytes:
    """One line of the tail: what a terminal would show of it (after its last \\r), cut at LINE_CAP."""
    line = line.rstrip(b"\r")
    return line[line.rfind(b"\r") + 1:][:LINE_CAP] + b"\n"
