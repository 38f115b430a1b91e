"""Waiting for the rank monitor's replies: a monitor that is busy or starved of CPU is waited for (256 agents on
16 cores, load 460: its 'armed' took over 10 s and every launch failed with an internal error), one that sits
idle without answering is not. Real processes stand for the monitor: one that burns CPU, one that sleeps."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from mbr_launch.monitor.link import MonitorError, MonitorLink
from mbr_launch.monitor.wire import MonitorEvent

pytestmark = [pytest.mark.timeout(60), pytest.mark.processes]


def _link(code: str) -> MonitorLink:
    link = MonitorLink()
    link._proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL)
    return link


def _end(link: MonitorLink) -> None:
    assert link._proc is not None
    link._proc.kill()
    link._proc.wait(10)


def test_a_busy_monitor_is_waited_for_past_its_timeout():
    link = _link("while True: pass")
    try:
        threading.Timer(2.0, lambda: link._replies[MonitorEvent.ARMED].put({"ev": MonitorEvent.ARMED})).start()
        began = time.monotonic()
        assert link._wait(MonitorEvent.ARMED, 0.4) == {"ev": MonitorEvent.ARMED}
        assert time.monotonic() - began >= 1.9
    finally:
        _end(link)


def test_an_idle_monitor_that_does_not_answer_is_an_error():
    link = _link("import time; time.sleep(60)")
    try:
        time.sleep(0.5)  # past its start-up (CPU spent then would read as work)
        with pytest.raises(MonitorError, match="idle, not starved"):
            link._wait(MonitorEvent.ARMED, 0.5)
    finally:
        _end(link)
