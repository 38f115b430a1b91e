"""The launcher's terminal: worker output, the agent's messages and the live status area go through one owner,
so that nothing written is lost, glued or drawn over.

Each source's prefix goes at every line start; two sources never share a line. With a live area up, complete
lines go above it and unfinished ones (a progress bar) inside it; it is redrawn under one lock at most every
``FRAME`` seconds, the cursor left below it, so a stray write by another process lands on a line of its own.
"""

from __future__ import annotations

import atexit
import os
import re
import sys
import threading
import unicodedata
from typing import Any, Callable, Sequence, TextIO

from mbr_launch.fdwait import ready
from mbr_launch.visible import one_line

BUFFER = 64 * 1024  # bytes held for one device before they are written, whatever else is ready
LINE_CAP = 64 * 1024  # an unfinished line kept for the live area scrolls up in pieces of this size
FRAME = 0.04  # seconds between two redraws of the live area (worker output is coalesced in between)

Render = Callable[[int], Sequence[str]]  # terminal width -> the status rows (ANSI allowed, each within width)

# A line start inside a chunk: after \n, or after a \r that is not the first half of \r\n; not before a \r
# (the line is redrawn once more) and not at the chunk's end (the next chunk decides).
_STARTS = re.compile(rb"(?:(?<=\n)|(?<=\r)(?!\n))(?=[^\r])")
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")


class Device:
    """One output device behind one or two fds (stdout and stderr on one terminal share it)."""

    def __init__(self, fd: int, tty: bool) -> None:
        self.fd, self.tty = fd, tty
        self.buf = bytearray()
        self.buf_fd = fd
        self.owner: ConsoleSource | None = None  # the source whose unfinished line the cursor stands after
        self.alive = True
        self.live = False  # a status area is pinned at the bottom
        self.drawn = 0  # rows of the area on the screen now (the cursor is at the start of the row below)
        self.dirty = False  # the area must be redrawn

    def put(self, fd: int, data: bytes) -> None:
        if not self.tty and fd != self.buf_fd:
            self.write_out()  # a file shared by stdout and stderr: keep the order, each through its fd
            self.buf_fd = fd
        self.buf += data

    def write_out(self, extra: bytes = b"") -> None:
        data, self.buf = bytes(self.buf) + extra, bytearray()
        if not self.alive or not data:
            return
        try:
            write_all(self.fd if self.tty else self.buf_fd, data)
        except OSError:
            self.alive = False  # a closed terminal or pipe: keep draining the workers, show nothing more


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:  # someone made the terminal non-blocking: wait until it takes more
            ready([fd], 1.0, write=True)


def size(fd: int) -> tuple[int, int]:
    try:
        cols, rows = os.get_terminal_size(fd)
    except OSError:
        cols, rows = 0, 0
    return cols or 80, rows or 24


def isatty(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False


def same_device(a: int, b: int) -> bool:
    try:
        sa, sb = os.fstat(a), os.fstat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino, sa.st_rdev) == (sb.st_dev, sb.st_ino, sb.st_rdev)


class ConsoleSource:
    """One stream written through the console with its own prefix and line state."""

    def __init__(self, console: "Console", stream: str, prefix: bytes) -> None:
        self.console, self.stream, self.prefix = console, stream, prefix
        self._template = prefix.replace(b"\\", b"\\\\")  # re.sub reads backslashes in a replacement
        self.at_start = True  # the next byte starts a line (a prefix goes first)
        self.after_cr = False  # ... and the last one was \r: a \n now ends the line, it starts none
        self.pending = bytearray()  # live area: this source's unfinished line, prefixed

    def write(self, data: bytes) -> bool:
        """False once the device is gone (a closed terminal): stop writing, keep draining."""
        return self.console.write(self, data)

    def flush(self) -> None:
        self.console.flush(soon=True)

    def end(self) -> None:
        self.console.end(self)

    def prefixed(self, data: bytes) -> bytes:
        if not data:
            return data
        head = self.prefix if self.at_start and data[:1] != b"\r" and not (
            self.after_cr and data[:1] == b"\n") else b""
        if not self.prefix:
            body = data
        elif b"\r" not in data:  # the common case, at the speed of bytes.replace
            body = data.replace(b"\n", b"\n" + self.prefix)
            if data.endswith(b"\n"):
                body = body[: len(body) - len(self.prefix)]
        else:
            body = _STARTS.sub(self._template, data)
        last = data[-1:]
        self.at_start, self.after_cr = last in (b"\n", b"\r"), last == b"\r"
        text = head + body if head else body
        # Once a process group exists torch starts lines of its own with the same ``[rankN]:`` (its logging
        # handler: TORCH_LOGS, dynamo's warnings; its excepthook): the prefix goes on once.
        return text.replace(self.prefix + self.prefix, self.prefix) if self.prefix in data else text


class Console:
    def __init__(self, out_fd: int = 1, err_fd: int = 2, *, redirect: bool = False) -> None:
        self._lock = threading.RLock()
        self._wake = threading.Condition(self._lock)
        err = Device(err_fd, isatty(err_fd))
        out = err if same_device(out_fd, err_fd) else Device(out_fd, isatty(out_fd))
        self._devices = {"stdout": out, "stderr": err}
        self._fds = {"stdout": out_fd, "stderr": err_fd}
        self._sources: dict[int, ConsoleSource] = {}  # sources with output so far and no end yet, in first-write order
        self._own = {name: ConsoleSource(self, name, b"") for name in self._fds}  # the agent's messages
        self._render: Render | None = None
        self._rows: tuple[int, list[str]] | None = None  # (width, status rows): rendered once per update
        self._painter: threading.Thread | None = None
        self._redirect = redirect  # the process's console: sys.stdout/sys.stderr go through it while live
        self._saved: tuple[TextIO, TextIO] | None = None
        self._exit_hook = False

    def source(self, stream: str, prefix: bytes = b"") -> ConsoleSource:
        return ConsoleSource(self, stream, prefix)

    def is_terminal(self, stream: str = "stderr") -> bool:
        return self._devices[stream].tty

    def say(self, text: str, stream: str = "stderr") -> None:
        """One line of the agent's own, shown at once, with no control character whatever it quotes."""
        self._own[stream].write(one_line(text).encode(errors="replace") + b"\n")
        self.flush()

    # ---- writing --------------------------------------------------------------------------------

    def write(self, src: ConsoleSource, data: bytes) -> bool:
        with self._lock:
            dev = self._devices[src.stream]
            if not dev.alive:
                return False
            text = src.prefixed(data)
            self._sources.setdefault(id(src), src)
            if dev.live:
                self._above(dev, src, text)
            else:
                if dev.owner is not None and dev.owner is not src:
                    self._break(dev)
                dev.put(self._fds[src.stream], text)
                dev.owner = None if text.endswith(b"\n") else src
            if len(dev.buf) >= BUFFER:
                self._flush(dev)
            return dev.alive

    def _above(self, dev: Device, src: ConsoleSource, text: bytes) -> None:
        cut = text.rfind(b"\n") + 1
        if cut:
            dev.put(dev.fd, bytes(src.pending) + text[:cut])
            src.pending = bytearray(text[cut:])
        else:
            src.pending += text
        redraw = src.pending.rfind(b"\r", 0, len(src.pending) - 1)
        if redraw >= 0:
            del src.pending[: redraw + 1]  # a \r redraws the line: only what follows it is still shown
        if len(src.pending) > LINE_CAP:  # a line without end: it scrolls up in pieces, memory stays bounded
            dev.put(dev.fd, bytes(src.pending) + b"\n")
            src.pending.clear()
            src.at_start, src.after_cr = True, False
        dev.dirty = True

    def _break(self, dev: Device) -> None:
        owner, dev.owner = dev.owner, None
        if owner is not None:
            dev.put(self._fds[owner.stream], b"\n")
            owner.at_start, owner.after_cr = True, False

    def end(self, src: ConsoleSource) -> None:
        with self._lock:
            dev = self._devices[src.stream]
            if src.pending:
                dev.put(dev.fd, bytes(src.pending) + b"\n")
                src.pending.clear()
                dev.dirty = True
            elif dev.owner is src:
                self._break(dev)
            self._sources.pop(id(src), None)
            self._flush(dev)

    def flush(self, *, soon: bool = False) -> None:
        """Write what is buffered; ``soon``: with a live area up, within ``FRAME`` (redraws are coalesced)."""
        with self._lock:
            for dev in {id(d): d for d in self._devices.values()}.values():  # stdout and stderr may be one
                if soon and dev.live:
                    self._wake.notify()
                else:
                    self._flush(dev)

    def _flush(self, dev: Device) -> None:
        if not dev.alive:
            dev.buf.clear()
            return
        if not dev.drawn and not dev.live:
            dev.write_out()
            return
        if not dev.buf and not dev.dirty:
            return
        erase = b"\r\x1b[%dA\x1b[J" % dev.drawn if dev.drawn else b""
        rows = self._area(dev) if dev.live else []
        dev.buf[:0] = erase
        dev.write_out(b"".join(row.encode(errors="replace") + b"\n" for row in rows))
        dev.drawn, dev.dirty = len(rows), False

    # ---- the live area --------------------------------------------------------------------------

    def set_status(self, render: Render | None) -> bool:
        """Pin or update the status area; None takes it away. False: no terminal."""
        with self._lock:
            dev = self._devices["stderr"]
            if render is None:
                self._stop(dev)
                return True
            if not dev.tty or not dev.alive:
                return False
            if not dev.live:
                self._start(dev)
            self._render, self._rows, dev.dirty = render, None, True
            self._flush(dev)
            return True

    def _start(self, dev: Device) -> None:
        if dev.owner is not None:
            self._break(dev)  # the area goes below: the dangling line is ended, its rest shows in the area
        dev.live = True
        self._painter = threading.Thread(target=self._paint, args=(dev,), daemon=True, name="console-live")
        self._painter.start()
        if not self._exit_hook:  # an agent that dies of an exception leaves no table behind
            self._exit_hook = True
            atexit.register(self.set_status, None)
        if self._redirect and self._saved is None:
            self._saved = (sys.stdout, sys.stderr)
            sys.stdout = _TextStream(self._own["stdout"], sys.stdout)  # type: ignore[assignment]
            sys.stderr = _TextStream(self._own["stderr"], sys.stderr)  # type: ignore[assignment]

    def _stop(self, dev: Device) -> None:
        if not dev.live:
            return
        dev.live, self._render, self._rows, dev.dirty = False, None, None, True
        self._wake.notify_all()
        self._flush(dev)  # erases the area
        for src in list(self._sources.values()):  # unfinished lines go back where a terminal shows them
            if src.pending and self._devices[src.stream] is dev:
                if dev.owner is not None and dev.owner is not src:
                    self._break(dev)
                dev.put(dev.fd, bytes(src.pending))
                src.pending.clear()
                dev.owner = src
        dev.write_out()
        if self._saved is not None:
            if isinstance(sys.stdout, _TextStream):
                sys.stdout = self._saved[0]
            if isinstance(sys.stderr, _TextStream):
                sys.stderr = self._saved[1]
            self._saved = None

    def _paint(self, dev: Device) -> None:
        me = threading.current_thread()
        with self._wake:
            while dev.live and self._painter is me:  # a later area has a painter of its own
                if not dev.buf and not dev.dirty:
                    self._wake.wait()
                    continue
                self._wake.wait(FRAME)  # more output may come: one redraw for all of it
                if dev.live and self._painter is me:
                    self._flush(dev)

    def _area(self, dev: Device) -> list[str]:
        width, height = size(dev.fd)
        rows = [_visible(src.pending, width - 1) for src in self._sources.values()
                if src.pending and self._devices[src.stream] is dev]
        if self._render is not None:
            if self._rows is None or self._rows[0] != width:
                try:
                    self._rows = (width, list(self._render(width - 1)))
                except Exception:
                    self._rows = (width, [])  # a display problem must never disturb the output
            rows += self._rows[1]
        return rows[: max(0, height - 2)]  # a taller area could not be erased: its top would scroll away


class _TextStream:
    """``sys.stdout``/``sys.stderr`` while the live area is up: Python-level text lands above it."""

    def __init__(self, source: ConsoleSource, original: TextIO) -> None:
        self._source, self._original = source, original

    @property
    def encoding(self) -> str:
        return getattr(self._original, "encoding", None) or "utf-8"

    def write(self, text: str) -> int:
        data = text.encode(self.encoding, errors="replace")
        self._source.write(data)
        if b"\n" in data:
            self._source.console.flush()
        return len(text)

    def flush(self) -> None:
        self._source.console.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._original, name)


def _visible(line: bytearray, width: int) -> str:
    text = _ESCAPES.sub("", bytes(line).rstrip(b"\r").decode(errors="replace"))
    out, used = [], 0
    for ch in text.replace("\t", " "):
        if not ch.isprintable():
            continue
        w = 0 if unicodedata.combining(ch) else 2 if unicodedata.east_asian_width(ch) in "WF" else 1
        if used + w > width:
            break
        out.append(ch)
        used += w
    return "".join(out)


_PROCESS: Console | None = None
_PROCESS_LOCK = threading.Lock()


def process_console() -> Console:
    """The console of this process's stdout and stderr, shared by every writer of the launcher."""
    global _PROCESS
    with _PROCESS_LOCK:
        if _PROCESS is None:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()  # what Python buffered so far comes first
                except (AttributeError, OSError, ValueError):
                    pass
            _PROCESS = Console(1, 2, redirect=True)
        return _PROCESS
