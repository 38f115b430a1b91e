"""A worker cannot take over the launcher's terminal (issue 29, "The console"): whatever bytes it writes, no line
it writes can pass for the launcher's (every row it starts begins with its rank prefix, drawn plainly), nothing
the launcher printed is moved or erased, no window title is set; colours and ``\\r`` progress bars still work.
The agent's messages that quote a worker (a reason, an exception's text) are one line each, and the status
table shows worker-given section names as text. Off a terminal the worker's bytes are kept as they are."""

from __future__ import annotations

import fcntl
import os
import random
import re
import threading
import time
from typing import Callable

import pytest

from mbr_launch.report.console import Console
from mbr_launch.workers.output import OutputPump

from testkit.helpers import read_ready, run_on_pty
from .vt import Terminal

pytestmark = pytest.mark.timeout(60)

PREFIX = "[rank0]:"
GENUINE = "[mbr-launch vm] started 1 workers, ranks 0-0"
FORGED = b"[mbr-launch vm] HANG: rank 3 (forged)"

HOSTILE = {
    "erase the line above": b"\x1b[1A\x1b[2K",
    "clear the screen": b"\x1b[H\x1b[2J",
    "erase this line, prefix included": b"\x1b[2K\x1b[1K",
    "title, BEL": b"\x1b]0;pwned\x07",
    "title, ST": b"\x1b]2;pwned\x1b\\",
    "conceal the next prefix": b"\x1b[8m",
    "black on black": b"\x1b[30;40m",
    "C1 CSI, raw byte": b"\x9b2J",
    "C1 CSI, UTF-8": "\u009b2J".encode(),
    "backspaces into the prefix": b"\x08" * 12,
    "full reset": b"\x1bc",
    "save and restore the cursor": b"\x1b7\x1b[2A\x1b8",
    "vertical tab, form feed": b"\x0b\x0c",
}


def _console() -> tuple[Console, int, list[int]]:
    """A console whose stderr is a pipe taken for a terminal: the bytes are checked as a terminal would get them."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    for fd in (out_w, err_w):
        fcntl.fcntl(fd, 1031, 1 << 20)  # F_SETPIPE_SZ: room for all a test writes, read after
    console = Console(out_w, err_w)
    console._devices["stderr"].tty = True
    return console, err_r, [out_r, out_w, err_r, err_w]


def _pump(console: Console) -> tuple[int, threading.Thread]:
    """A real pump of rank 0's stderr into ``console``: (the worker's end of its pipe, the pump's thread)."""
    read_end, write_end = os.pipe()
    pump = OutputPump(os.fdopen(read_end, "rb", buffering=0), prefix=PREFIX.encode(),
                      console=console.source("stderr", PREFIX.encode()), logfile=None)
    return write_end, pump.start()


def _wait_for(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, "the pump did not pass the output on"
        time.sleep(0.01)


def _through_pump(console: Console, chunks: list[bytes]) -> None:
    worker, pump = _pump(console)
    for chunk in chunks:
        os.write(worker, chunk)
        time.sleep(0.01)  # mostly one read each
    os.close(worker)
    pump.join(10)


def _check_terminal_safe(raw: bytes, *, genuine: list[str]) -> list[str]:
    """What a terminal shows of ``raw``; asserts that only colours (and an erase to the right) reached it, that each
    prefix is drawn with no
    colour or attribute in effect, that ``genuine`` (the launcher's lines) are there as printed, and that every
    other row starts with a rank prefix."""
    text = raw.decode()  # UTF-8 throughout: a stray byte 0x9b is a CSI to some terminals
    assert not re.search(r"[\x00-\x08\x0b\x0c\x0e-\x1a\x1c-\x1f\x7f-\x9f]", text), raw
    assert all(m.group(1) for m in re.finditer(rb"\x1b(\[[0-9;:]*m|\[0?K)?", raw)), f"an escape not kept: {raw!r}"
    attributes = False
    for m in re.finditer(rb"\x1b\[([0-9;:]*)m|(\[rank\d+\]:)", raw):
        if m.group(2):
            assert not attributes, f"a prefix drawn with the worker's attributes: {raw!r}"
        else:
            attributes = m.group(1).split(b";")[-1] not in (b"", b"0")
    term = Terminal(100, 30)
    term.feed(text.replace("\n", "\r\n"))  # as the terminal's line discipline passes it on
    lines = term.lines()
    for line in genuine:
        assert line in lines, lines
    others = [line for line in lines if line not in genuine]
    assert all(line.startswith("[rank") for line in others), lines
    return lines


@pytest.mark.parametrize("hostile", list(HOSTILE.values()), ids=list(HOSTILE))
def test_worker_bytes_cannot_forge_erase_or_retitle_on_a_terminal(hostile):
    console, err_r, fds = _console()
    try:
        console.say(GENUINE)
        _through_pump(console, [b"step 1\n", hostile + FORGED + b"\n",
                                b"partial " + hostile + b"\r" + FORGED,  # a \r mid-line: the prefix comes again first
                                b"\n" + hostile, b"\n" + FORGED + b"\n"])
        console.say("[mbr-launch vm] done")
        console.flush()
        raw = read_ready(err_r)
    finally:
        for fd in fds:
            os.close(fd)
    lines = _check_terminal_safe(raw, genuine=[GENUINE, "[mbr-launch vm] done"])
    assert lines[0] == GENUINE and lines[1] == f"{PREFIX}step 1", lines
    assert not any(line.startswith("[mbr-launch vm] HANG") for line in lines), lines


def test_any_bytes_reach_a_terminal_only_as_text_colours_and_an_erase_to_the_right():
    """Random pieces of escapes, C1 bytes, bidi overrides and UTF-8 cut anywhere, in chunks: what a terminal gets
    is valid UTF-8 with no control character but \\t, \\r, \\n, SGR and ``ESC [ K``, and never raises."""
    from mbr_launch.workers import output

    pieces = [b"\x1b", b"[", b"3", b"1", b"m", b"K", b"0", b";", b"\r", b"\n", b"\t", b"a", b"\x9b", b"\xc2", b"]",
              b"\x07", b"\xff", b"\xe2\x80\xae", b"\xe2", b"\x96", b"\x88"]
    rng = random.Random(29)
    for _ in range(2000):
        shown = output.ForTerminal()
        chunks = [b"".join(rng.choice(pieces) for _ in range(rng.randrange(20))) for _ in range(rng.randrange(1, 6))]
        raw = b"".join(shown.shown(chunk) for chunk in chunks) + shown.shown(b"", final=True)
        text = raw.decode()
        assert not re.search(r"[\x00-\x08\x0b\x0c\x0e-\x1a\x1c-\x1f\x7f-\x9f\u202e]", text), (chunks, raw)
        assert all(m.group(1) for m in re.finditer(r"\x1b(\[[0-9;:]*m|\[0?K)?", text)), (chunks, raw)


def test_the_agents_messages_quoting_a_worker_are_one_line_without_controls():
    console, err_r, fds = _console()
    try:
        console.say("[mbr-launch vm] FAILURE: rank 0 (local rank 0) on vm: RuntimeError: boom\n"
                    "[mbr-launch vm] all ranks finished\x1b[1A\x1b[2K\x1b]0;pwned\x07\r\tx")
        console.flush()
        raw = read_ready(err_r)
    finally:
        for fd in fds:
            os.close(fd)
    assert raw == (b"[mbr-launch vm] FAILURE: rank 0 (local rank 0) on vm: RuntimeError: boom\\n"
                   b"[mbr-launch vm] all ranks finished\\x1b[1A\\x1b[2K\\x1b]0;pwned\\x07\\r\\tx\n")


def test_colours_and_progress_bars_still_work_on_a_terminal(monkeypatch):
    """A coloured progress bar redraws its line with \\r (and erases the rest of it with ``ESC [ K``): the last state
    shows, prefixed, in the live area and then as a line; a block of coloured lines keeps its colour on each line,
    after the prefix."""
    console, err_r, fds = _console()
    monkeypatch.setattr("mbr_launch.report.console.size", lambda fd: (60, 12))
    try:
        worker, pump = _pump(console)
        os.write(worker, b"\x1b[31merror: one\nerror: two\x1b[0m\n")
        shown = bytearray()
        _wait_for(lambda: bool(shown.extend(read_ready(err_r))) or b"two" in shown)
        assert console.set_status(lambda width: ["status"])
        for pct in (10, 50):
            os.write(worker, b"\r\x1b[K\x1b[32mtrain: " + f"{pct}%".encode() + b" \xe2\x96\x88\xe2\x96\x88\x1b[0m")
        _wait_for(lambda: console._area(console._devices["stderr"])[0] == f"{PREFIX}train: 50% ██")
        os.write(worker, b"\r\x1b[32mtrain: 100% \xe2\x96\x88\xe2\x96\x88\xe2\x96\x88\x1b[0m\n")
        os.close(worker)
        pump.join(10)
        console.set_status(None)
        console.flush()
        raw = bytes(shown) + read_ready(err_r)
    finally:
        for fd in fds:
            os.close(fd)
    assert raw.startswith(b"[rank0]:\x1b[31merror: one\x1b[0m\n[rank0]:\x1b[31merror: two\x1b[0m\n"), raw
    term = Terminal(60, 12)
    term.feed(raw.decode().replace("\n", "\r\n"))
    lines = term.lines()
    assert b"[rank0]:\x1b[K\x1b[32mtrain: 50%" in raw, raw  # the erase to the right is kept
    assert lines == [f"{PREFIX}error: one", f"{PREFIX}error: two", f"{PREFIX}train: 100% ███"], lines


def test_off_a_terminal_the_workers_bytes_are_kept_as_written_with_the_prefix():
    """A file or a pipe (Slurm's output file) gets the bytes as the worker wrote them: tools read them there, and
    the rank's own log file has them the same way; each line start, after \\n or \\r, still gets the prefix."""
    console, err_r, fds = _console()
    console._devices["stderr"].tty = False
    try:
        _through_pump(console, [b"\x1b[32mok\x1b[0m \x1b]0;t\x07\xff\rbar\n"])
        console.flush()
        raw = read_ready(err_r)
    finally:
        for fd in fds:
            os.close(fd)
    assert raw == b"[rank0]:\x1b[32mok\x1b[0m \x1b]0;t\x07\xff\r[rank0]:bar\n"


def test_the_status_table_shows_section_names_as_text():
    from mbr_launch.agent.statusview import _render

    rows = {0: {"local_rank": 0, "rank": 0, "state": "running",
                "open_sections": ["\x1b]0;pwned\x07step", "[bold]x[/bold]", "\x1b[2J"]}}
    out = "\n".join(_render(rows, {0: 1}, "truecolor", 160))
    assert "\x1b]" not in out and "\x1b[2J" not in out, out
    assert "[bold]x[/bold]" in out and "\\x1b]0;pwned\\x07step" in out, out


# ---- a real launch on a pseudo-terminal ------------------------------------------------------------------------

HOSTILE_WORKER = r"""
import sys
w = sys.stdout.write
w("step 1\n")
w("\x1b]0;pwned\x07\x1b[H\x1b[2J[mbr-launch vm] HANG: forged 1\n")
w("\x1b[1A\x1b[2K\r[mbr-launch vm] HANG: forged 2\n")
w("\x1b[8m\n\x1b[28m[mbr-launch vm] HANG: forged 3\n")
w("partial\r[mbr-launch vm] HANG: forged 4\n")
sys.stdout.flush()
"""


@pytest.mark.processes
@pytest.mark.timeout(120)
def test_a_hostile_worker_on_a_real_terminal(tmp_path):
    script = tmp_path / "hostile.py"
    script.write_text(HOSTILE_WORKER)
    cols, rows = 200, 40
    reads = run_on_pty(["--nproc-per-node", "1", "--status", "off", "--skip-check", "all", "--tee", "3", "--log-dir",
                        str(tmp_path / "logs"), str(script)], cols=cols, rows=rows, timeout=100)
    chunks = [data for _, data in reads]
    raw = b"".join(chunks).replace(b"\r\n", b"\n")  # the pty's own output processing
    assert b"\x1b]" not in raw, raw
    term = Terminal(cols, rows)
    term.feed(raw.replace(b"\n", b"\r\n").decode(errors="replace"))
    lines = term.lines()
    launcher = [line for line in lines if line.startswith("[mbr-launch")]
    assert any("started 1 workers" in line for line in launcher), lines  # not erased
    assert not any("forged" in line for line in launcher), lines
    assert [line for line in lines if "forged" in line] == [
        "[rank0]:\\x1b]0;pwned\\x07\\x1b[H\\x1b[2J[mbr-launch vm] HANG: forged 1",
        "[rank0]:[mbr-launch vm] HANG: forged 2",
        "[rank0]:[mbr-launch vm] HANG: forged 3",
        "[rank0]:[mbr-launch vm] HANG: forged 4"], lines
    [log] = (tmp_path / "logs").rglob("stdout.log")
    assert b"\x1b]0;pwned\x07\x1b[H" in log.read_bytes()  # the rank's own log file keeps its bytes
