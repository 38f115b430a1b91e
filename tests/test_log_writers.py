"""The log writers on a full or failing disk: whole lines or nothing, counted losses, one warning, and a
pump that drains its pipe whatever happens to its log (issue 16, finding 1). ENOSPC is real (a 64 KiB
tmpfs, root only); EIO, which a disk gives neither often nor on demand, is injected into ``os.write``.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys

import pytest

from mbr_launch.report.appender import LineAppender
from mbr_launch.report.events import EventLog
from mbr_launch.workers.output import OutputPump

from testkit.helpers import validate

from .tinydisk import fill, tiny_disk, whole_lines  # noqa: F401 (tiny_disk: a fixture)

pytestmark = pytest.mark.timeout(30)


def _failing_write(fail_after: int, err: int):
    """An ``os.write`` that writes ``fail_after`` bytes in all, then raises ``err``."""
    budget = [fail_after]

    def write(fd: int, data: memoryview) -> int:
        if budget[0] <= 0:
            raise OSError(err, os.strerror(err))
        n = os.write(fd, data[: budget[0]])
        budget[0] -= n
        return n
    return write



# ---- the writers -----------------------------------------------------------------------------------------


@pytest.mark.processes
def test_appender_on_a_full_disk_keeps_whole_lines_and_counts_the_rest(tiny_disk):
    fill(tiny_disk, leave_pages=1)
    log = LineAppender(tiny_disk / "out.log")
    line = b"x" * 99 + b"\n"
    written = sum(log.append(line) for _ in range(60))  # 6000 bytes: the page holds 40 lines and a part
    assert written == 40 and not log.ok and log.error.errno == errno.ENOSPC
    assert log.lost_lines == 20 and log.lost_bytes == 2000
    assert (tiny_disk / "out.log").read_bytes() == line * 40  # the part of line 41 was rolled back
    log.close()


def test_appender_on_eio_rolls_back_the_cut_line(tmp_path):
    path = tmp_path / "out.log"
    log = LineAppender(path, write=_failing_write(150, errno.EIO))
    assert log.append(b"a" * 99 + b"\n")
    assert not log.append(b"b" * 99 + b"\n")  # 50 bytes of it got written, then EIO
    assert not log.append(b"c\n")
    assert path.read_bytes() == b"a" * 99 + b"\n"
    assert log.error.errno == errno.EIO and (log.lost_lines, log.lost_bytes) == (2, 102)


def test_event_log_on_eio_warns_once_never_raises_and_keeps_records(tmp_path):
    path = tmp_path / "events.jsonl"
    warnings: list[str] = []
    log = EventLog(path, node="n0", warn=warnings.append, write=_failing_write(300, errno.EIO))  # after ~2 lines
    for i in range(5):
        log.emit("signal", signal=f"SIG{i}" * 20)
    log.close()
    assert len(warnings) == 1 and "Input/output error (EIO)" in warnings[0], warnings
    lines = whole_lines(path)
    assert 1 <= len(lines) < 5 and all(not validate(r) for r in lines)
    assert log.lost == 5 - len(lines) and len(log.records) == 5


@pytest.mark.processes
def test_pump_keeps_draining_when_the_log_fails(tmp_path):
    """A worker that writes far more than a pipe holds finishes although its log file fails at once."""
    worker = subprocess.Popen([sys.executable, "-c", "import sys\nfor i in range(20000): print('x' * 60, i)"],
                              stdout=subprocess.PIPE)
    failures = []
    pump = OutputPump(worker.stdout, prefix=b"[rank0]:", console=None, logfile=tmp_path / "stdout.log",
                      appender=lambda p: LineAppender(p, write=_failing_write(1000, errno.EIO)),
                      on_log_failure=lambda _pump, log: failures.append(log.error.errno))
    thread = pump.start()
    assert worker.wait(20) == 0, "the worker blocked writing to its pipe"
    thread.join(10)
    assert not thread.is_alive() and failures == [errno.EIO]
    assert pump.log.lost_lines == 20000 - len((tmp_path / "stdout.log").read_bytes().splitlines())
