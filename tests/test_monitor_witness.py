"""The rank monitor keeps the job's signals pending (monitor/witness.py): the agent reads there that Slurm signalled
every process of its step. Real monitors, forked and started as an interpreter, in their own interpreter each
(pytest's process is not forked); the parsing of ``/proc/PID/status``, pure."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap

import pytest

from mbr_launch.monitor.witness import JOB_SIGNALS, parse_pending
from testkit.helpers import REPO

pytestmark = pytest.mark.processes

SENT = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT, signal.SIGQUIT)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fork", [True, False], ids=["forked", "interpreter"])
def test_a_signal_sent_to_the_monitor_stays_pending_there_and_it_serves_on(tmp_path, fork: bool) -> None:
    code = textwrap.dedent(f"""
        import json, os, signal, time
        from mbr_launch.monitor.link import MonitorLink
        link = MonitorLink(lambda event: None).spawn(fork={fork})
        sock = {str(tmp_path / "sock")!r}
        os.mkdir(sock, 0o700)
        # Configured: its threads run (a thread that let the signal through would take it away).
        link.start(__import__("pathlib").Path(sock), {{"rank_heartbeat_timeout": None,
                                                      "workload_check_interval": 5.0}}, timeout=60)
        before = sorted(link.pending_signals())
        for sig in {[int(s) for s in SENT]}:
            os.kill(link.pid, sig)
        end, seen = time.monotonic() + 30, None
        while time.monotonic() < end and set(seen or ()) != set({[int(s) for s in SENT]}):
            seen = link.pending_signals()
            time.sleep(0.05)
        alive = link.exit_code() is None
        snapshot = link.snapshot(timeout=30)  # it still answers
        link.close(timeout=30)  # and still ends through the agent
        print(json.dumps({{"before": before, "seen": sorted(seen or ()), "alive": alive,
                          "answers": "ev" in snapshot, "code": link.exit_code(), "after": link.pending_signals()}}))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=110, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {"before": [], "seen": sorted(int(s) for s in SENT), "alive": True, "answers": True, "code": 0,
                    "after": None}, seen


def test_every_signal_a_launcher_stops_on_by_default_is_held() -> None:
    assert {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1} <= set(JOB_SIGNALS)


@pytest.mark.parametrize("raw,expected", [
    (b"Name:\tx\nSigPnd:\t0000000000000000\nShdPnd:\t0000000000004200\nSigBlk:\t0000000000004200\n",
     {signal.SIGUSR1, signal.SIGTERM}),
    (b"SigPnd:\t0000000000000002\nShdPnd:\t0000000000000000\n", {signal.SIGINT}),  # sent to the thread
    (b"SigPnd:\t0\nShdPnd:\t0\n", set()),
    (b"Name:\tgone\n", None),  # no masks: unknown, not "none pending"
    (b"ShdPnd:\tzz\n", None),
    (b"ShdPnd:\t" + b"f" * 5000 + b"\n", set(range(1, 129))),  # bounded: 32 hex digits at most
    (b"", None),
])
def test_parse_pending(raw: bytes, expected: set[int] | None) -> None:
    got = parse_pending(raw)
    assert (None if got is None else set(got)) == expected
