"""What a user sees of the workers' output (issue 15, findings 1 and 2): the live status view on a real
pseudo-terminal loses no line, piles nothing up and glues nothing to its border; output passes through as it
comes (partial lines and ``\\r`` progress bars), and an endless line keeps the agent's memory bounded.
The console's rules themselves are checked in-process on real pipes."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import threading
import time

import psutil
import pytest

from mbr_launch.report.console import LINE_CAP, Console

from testkit.helpers import LAUNCHER, REPO, launcher_env, read_ready, run_on_pty
from .vt import Terminal

pytestmark = pytest.mark.timeout(120)

BOX = "│┃━─┏┓┗┛┡┩╇╈┠┨┼"  # rich's table borders

STEPS_AND_BAR = """
import sys, time
for i in range(30):
    print(f"step {i}", flush=True)
    if i % 3 == 0:
        sys.stderr.write(f"\\rbar {i}%")
        sys.stderr.flush()
    time.sleep(0.1)
sys.stderr.write("\\rbar done\\n")
"""


@pytest.mark.processes
def test_live_view_on_a_terminal_keeps_every_line_and_shows_progress_as_it_comes(tmp_path):
    script = tmp_path / "steps.py"
    script.write_text(STEPS_AND_BAR)
    cols, rows = 100, 30
    reads = run_on_pty(["--nproc-per-node", "2", "--status", "live", "--skip-check", "all", str(script)],
                        cols=cols, rows=rows, timeout=90)
    raw = b"".join(data for _, data in reads).decode(errors="replace")
    term = Terminal(cols, rows)
    term.feed(raw)
    lines = term.lines()
    shown = "\n".join(lines)
    assert "mbr-launch ranks" in raw, "the live view was never drawn:\n" + shown
    for rank in (0, 1):
        steps = [line for line in lines if line.startswith(f"[rank{rank}]:step ")]
        assert steps == [f"[rank{rank}]:step {i}" for i in range(30)], shown
        assert f"[rank{rank}]:bar done" in lines, shown
    assert not any("mbr-launch ranks" in line for line in lines), "copies of the table were left:\n" + shown
    assert not any("[rank" in line and any(ch in line for ch in BOX) for line in lines), shown
    # The bar's first piece (no newline after it) reached the terminal while the worker still ran.
    first = next(t for t, _ in _arrivals(reads, "[rank0]:bar 0%"))
    done = next(t for t, _ in _arrivals(reads, "[rank0]:bar done"))
    assert done - first > 1.5, (first, done)


def _arrivals(reads: list[tuple[float, bytes]], text: str):
    """(time, offset) of the reads by which ``text`` had arrived."""
    seen = b""
    for t, data in reads:
        seen += data
        if text.encode() in seen:
            yield t, len(seen)


ENDLESS_LINE = """
import sys, time
sys.stderr.write("\\rloading 10%")
sys.stderr.flush()
time.sleep(2.0)
sys.stderr.write("\\rloading 100%\\n")
sys.stderr.flush()
time.sleep(0.5)
piece = b"x" * (1 << 20)
for _ in range({mb}):
    sys.stdout.buffer.write(piece)
sys.stdout.flush()
sys.stderr.write("y" * (3 << 20))
"""


@pytest.mark.processes
def test_output_passes_through_and_an_endless_line_keeps_memory_bounded(tmp_path):
    """A 100 MB line without a newline (stdout) and a 3 MB one (stderr, whose last lines the agent keeps),
    teed to log files and the console: the agent's memory grows by far less than the line; the log holds it
    whole; a \\r progress piece reaches the console when written, not when its line ends."""
    mb = 100
    script = tmp_path / "endless.py"
    script.write_text(ENDLESS_LINE.replace("{mb}", str(mb)))
    log_dir = tmp_path / "logs"
    proc = subprocess.Popen([*LAUNCHER, "--nproc-per-node", "1", "--tee", "3", "--status", "plain",
                             "--skip-check", "all", "--log-dir", str(log_dir), str(script)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=launcher_env(), cwd=REPO,
                            start_new_session=True)
    got = {"stdout": 0, "stderr": b""}
    times: list[tuple[float, bytes]] = []

    def drain_stdout() -> None:
        while data := proc.stdout.read1(1 << 20):  # type: ignore[union-attr]
            got["stdout"] += data.count(b"x")

    def drain_stderr() -> None:
        while data := proc.stderr.read1(1 << 16):  # type: ignore[union-attr]
            times.append((time.monotonic(), data))

    readers = [threading.Thread(target=f, daemon=True) for f in (drain_stdout, drain_stderr)]
    for reader in readers:
        reader.start()
    agent = psutil.Process(proc.pid)
    baseline, peak = None, 0
    try:
        deadline = time.monotonic() + 90
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                rss = agent.memory_info().rss
            except psutil.NoSuchProcess:
                break
            err = b"".join(d for _, d in times)
            if baseline is None and b"loading 10%" in err:
                baseline = rss  # the worker runs: the agent has everything loaded
            peak = max(peak, rss)
            time.sleep(0.02)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for reader in readers:
            reader.join(10)
    err = b"".join(d for _, d in times).decode(errors="replace")
    assert baseline is not None, err[-2000:]
    print(f"agent RSS {baseline >> 20} MiB -> peak {peak >> 20} MiB")
    assert peak - baseline < 40 << 20, f"agent grew by {(peak - baseline) >> 20} MiB for a {mb} MiB line"
    assert got["stdout"] == mb << 20
    logs = list(log_dir.rglob("stdout.log"))
    assert len(logs) == 1 and logs[0].stat().st_size == mb << 20
    first = next(t for t, _ in _arrivals(times, "[rank0]:loading 10%"))
    whole = next(t for t, _ in _arrivals(times, "[rank0]:loading 100%"))
    assert whole - first > 1.5, (first, whole)


# ---- the console's rules, in-process on pipes ----------------------------------------------------------


def _pipes(console_kw: dict | None = None) -> tuple[Console, int, int]:
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    for fd in (out_w, err_w):
        fcntl.fcntl(fd, 1031, 1 << 20)  # F_SETPIPE_SZ: room for all a test writes, read after
    return Console(out_w, err_w, **(console_kw or {})), out_r, err_r


def test_prefix_at_every_line_start_and_no_two_sources_on_one_line():
    console, out_r, err_r = _pipes()
    a, b = console.source("stdout", b"[rank0]:"), console.source("stdout", b"[rank1]:")
    a.write(b"one\ntw")
    a.write(b"o\n\nbar 1%\r")
    a.write(b"bar 2%\rbar 3%")
    a.flush()
    assert read_ready(out_r) == b"[rank0]:one\n[rank0]:two\n[rank0]:\n[rank0]:bar 1%\r[rank0]:bar 2%\r[rank0]:bar 3%"
    b.write(b"hello\n")  # rank 0's bar is unfinished: it is ended first, and continues with its prefix
    a.write(b"\rbar 4%\r\n")
    a.end()
    b.write(b"partial")
    b.end()
    console.flush()
    assert read_ready(out_r) == b"\n[rank1]:hello\n\r[rank0]:bar 4%\r\n[rank1]:partial\n"
    assert read_ready(err_r) == b""


def test_live_area_is_drawn_below_the_lines_and_bounded(monkeypatch):
    console, _out_r, err_r = _pipes()
    dev = console._devices["stderr"]
    dev.tty = True  # a pipe that counts as a terminal: the bytes are checked as they would be drawn
    monkeypatch.setattr("mbr_launch.report.console.size", lambda fd: (40, 10))
    src = console.source("stderr", b"[rank0]:")
    assert console.set_status(lambda width: [f"status ({width})"])
    src.write(b"line 1\nbar 5%")
    console.flush()
    src.write(b"\rbar 6%")
    src.write(b"x" * (LINE_CAP + 10))  # a line without end scrolls up in pieces
    console.flush()
    console.set_status(None)
    term = Terminal(40, 10)
    term.feed(read_ready(err_r).decode())
    assert term.lines()[:1] == ["[rank0]:line 1"]
    assert not any("status" in line for line in term.lines())
    assert term.lines()[1].startswith("[rank0]:bar 6%xxxx")
    assert len(src.pending) == 0


def test_pump_keeps_whole_lines_for_files_and_filters_and_a_bounded_tail(tmp_path):
    """The pump reads chunks, not lines: the log file still gets whole lines (and the unfinished last one at
    the end), the filters see whole lines across chunk boundaries, the tail keeps what a terminal shows of
    a \\r-redrawn line and at most LINE_CAP of an endless one."""
    import collections

    from mbr_launch.report.appender import LineAppender
    from mbr_launch.workers.output import OutputPump

    read_end, write_end = os.pipe()
    console, out_r, _err_r = _pipes()
    tail: collections.deque[bytes] = collections.deque(maxlen=3)
    filtered = LineAppender(tmp_path / "filtered.log")
    pump = OutputPump(os.fdopen(read_end, "rb", buffering=0), prefix=b"[rank0]:",
                      console=console.source("stdout", b"[rank0]:"), logfile=tmp_path / "out.log",
                      filters=["loss"], filtered=filtered, tail=tail)
    thread = pump.start()
    chunks = [b"step 1 lo", b"ss 0.5\nprogress 10%\rprogress 90%", b"\r\nstep 2 loss 0.4\n", b"z" * (LINE_CAP * 3),
              b"\nlast, no end"]
    for chunk in chunks:
        os.write(write_end, chunk)
        time.sleep(0.05)
    os.close(write_end)
    thread.join(10)
    filtered.close()
    assert (tmp_path / "out.log").read_bytes() == b"".join(chunks)
    assert (tmp_path / "filtered.log").read_bytes() == b"[rank0]:step 1 loss 0.5\n[rank0]:step 2 loss 0.4\n"
    assert list(tail) == [b"step 2 loss 0.4\n", b"z" * LINE_CAP + b"\n", b"last, no end\n"]
    shown = read_ready(out_r)
    assert shown.startswith(b"[rank0]:step 1 loss 0.5\n[rank0]:progress 10%\r[rank0]:progress 90%\r\n[rank0]:step 2")
    assert shown.endswith(b"\n[rank0]:last, no end\n")
