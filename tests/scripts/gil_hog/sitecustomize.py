"""Test-only (tests/test_starved_agents.py): put on PYTHONPATH with ``MBR_TEST_GIL_HOG=<file>``, every Python
process watches for that file; the one whose pid it names holds the GIL for the seconds it names (a busy loop
with a switch interval as long), so its other threads (an agent's beats, its main loop, its own clock) get no
turn: alive and running, yet silent -- a process starved as one on a loaded machine is."""

import os
import sys
import threading
import time

_TRIGGER = os.environ.get("MBR_TEST_GIL_HOG")


def _hog(trigger: str) -> None:
    while not os.path.exists(trigger):
        time.sleep(0.1)
    try:
        with open(trigger) as f:
            words = f.read().split()
        seconds, pids = float(words[0]), words[1:]
    except (OSError, ValueError, IndexError):
        return
    if str(os.getpid()) not in pids:
        return
    previous = sys.getswitchinterval()
    sys.setswitchinterval(seconds)  # no other thread gets the GIL before this loop ends
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
    sys.setswitchinterval(previous)


if _TRIGGER:
    threading.Thread(target=_hog, args=(_TRIGGER,), name="mbr-test-gil-hog", daemon=True).start()
