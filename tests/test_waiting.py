"""Waiting on the launcher, for real: progress lines where a person waits (rendezvous, crash-loop back-off,
a stop's grace) and Ctrl-C in those phases. Each launch gets SIGINT the way a terminal sends it (to the
launcher's process group) and must exit 130 within 2 s of it, record the signal, and leave nothing behind
(the autouse fixture checks that)."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest


from testkit.helpers import LAUNCHER, REPO, SCRIPTS, free_port, launcher_env, run_events

SLEEPER = str(SCRIPTS / "sleeper.py")
TRAIN = str(SCRIPTS / "train.py")
pytestmark = [pytest.mark.timeout(120), pytest.mark.processes]
EXIT_WITHIN = 2.0  # seconds from the signal to the launcher's exit


class Console:
    """The launcher's stderr, read as it comes, so a test can wait for a line and then act."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()

    def wait_for(self, text: str, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                found = next((line for line in self.lines if text in line), None)
                if found is not None:
                    return found
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    self.kill()
                    raise AssertionError(f"no line with {text!r} on the launcher's console:\n" + self.text())
                self._changed.wait(min(left, 0.5))

    def ctrl_c(self) -> float:
        """SIGINT to the launcher's process group, as a terminal's Ctrl-C; the seconds until it exited."""
        sent = time.monotonic()
        os.killpg(self.proc.pid, signal.SIGINT)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError("the launcher did not exit within 30 s of SIGINT:\n" + self.text())
        self._reader.join(5)
        return time.monotonic() - sent

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def text(self) -> str:
        return "\n".join(self.lines)


def _launch(args: list[str]) -> Console:
    return Console(subprocess.Popen([*LAUNCHER, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                    env=launcher_env(), cwd=REPO, start_new_session=True))


def _ended_by_sigint(console: Console, seconds: float, log_dir: Path) -> list[dict]:
    print(f"exit {seconds:.2f} s after SIGINT")  # measured: shown with pytest -s
    assert console.proc.returncode == 130, console.text()
    assert seconds < EXIT_WITHIN, f"exit took {seconds:.2f} s after SIGINT\n{console.text()}"
    events = run_events(log_dir)
    assert [e["signal"] for e in events if e["event"] == "signal"] == ["SIGINT"], events
    assert events[-1]["event"] == "end" and events[-1]["exit_code"] == 130, events[-1]
    return events


def test_rendezvous_progress_and_ctrl_c_while_waiting_for_nodes_or_for_the_store_host(tmp_path):
    """Two launches side by side (they share the start-up time). The store host of --nnodes 2, alone: lines say
    how many nodes joined and how long of the join timeout it has waited, and Ctrl-C ends it at once. A node
    started before the store's host: it waits inside torch's C++ store client, where Python runs no signal
    handler; Ctrl-C must end it too (main ignored it until the store client's 60 s connect timeout, and the
    rendezvous retried after that)."""
    common = ["--nnodes", "2", "--rdzv-backend", "c10d", "--nproc-per-node", "1", "--skip-check", "all"]
    alone, early = tmp_path / "alone", tmp_path / "early"
    host = _launch([*common, "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--rdzv-id", "alone", "--rdzv-conf",
                    "join_timeout=30", "--log-dir", str(alone), TRAIN])
    waiter = _launch([*common, "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--rdzv-id", "early", "--rdzv-conf",
                      "is_host=0", "--log-dir", str(early), TRAIN])
    try:
        line = host.wait_for("rendezvous: 1 of 2 nodes joined, waiting ")
        assert line.endswith(" of 30 s"), line
        seconds = host.ctrl_c()
        _ended_by_sigint(host, seconds, alone)
        assert "received SIGINT: while waiting in the rendezvous" in host.text()

        waiter.wait_for("rendezvous: waiting ")  # 2 s into the join: inside the store client's connect
        seconds = waiter.ctrl_c()
        _ended_by_sigint(waiter, seconds, early)
        assert "received SIGINT while blocked in a store call (joining the rendezvous): stopping now" in waiter.text()
    finally:
        host.kill()
        waiter.kill()


def test_stop_grace_and_crash_loop_back_off_are_shown_and_ctrl_c_ends_the_back_off(tmp_path):
    """Rank 0 crashes at once in every round, rank 1 ignores SIGTERM: each stop says whom it waits for and
    how long; the second quick failure backs off 5 s with a countdown line; Ctrl-C then ends the run."""
    console = _launch(["--standalone", "--nproc-per-node", "2", "--max-restarts", "5", "--restart-backoff", "5",
                       "--shutdown-timeout", "1.5", "--skip-check", "all", "--log-dir", str(tmp_path), SLEEPER,
                       "--crash", "0:0,0:1,0:2,0:3", "--crash-after", "0.1", "--ignore-term", "--run-seconds", "60"])
    stopping = console.wait_for("stopping rank 1: waiting up to 1.5 s for it to exit")
    assert "Ctrl-C kills at once" in stopping
    console.wait_for("rank 1 did not stop within 1.5 s: SIGKILL")
    console.wait_for("restarting in 5 s (back-off after 2 quick failures")
    seconds = console.ctrl_c()
    events = _ended_by_sigint(console, seconds, tmp_path)
    assert [e["backoff"] for e in events if e["event"] == "restart"] == [0.0, 5.0], events
    assert "received SIGINT: while restarting; stopping" in console.text()


def test_second_ctrl_c_kills_workers_that_ignore_the_first(tmp_path):
    """Training ranks that ignore SIGINT and SIGTERM: the first Ctrl-C is forwarded and the stop waits its
    grace (20 s) with a line saying so; the second Ctrl-C kills them at once."""
    ready = tmp_path / "ready"
    logs = tmp_path / "logs"
    console = _launch(["--standalone", "--nproc-per-node", "2", "--shutdown-timeout", "20", "--skip-check", "all",
                       "--log-dir", str(logs), SLEEPER, "--ready-file", str(ready), "--ignore-term", "--ignore-int",
                       "--run-seconds", "60"])
    deadline = time.monotonic() + 60
    while not (ready.exists() and len(ready.read_text().splitlines()) == 2):
        assert time.monotonic() < deadline and console.proc.poll() is None, console.text()
        time.sleep(0.1)
    os.killpg(console.proc.pid, signal.SIGINT)
    console.wait_for("received SIGINT: forwarding it to the workers")
    time.sleep(1.5)  # into the 20 s grace, past the moment its progress line is due
    seconds = console.ctrl_c()
    print(f"exit {seconds:.2f} s after the second SIGINT")
    assert console.proc.returncode == 130, console.text()
    assert seconds < EXIT_WITHIN, f"exit took {seconds:.2f} s after the second SIGINT\n{console.text()}"
    events = run_events(logs)
    text = console.text()
    assert [e["signal"] for e in events if e["event"] == "worker_exit"] == ["SIGKILL", "SIGKILL"], (events, text)
    assert events[-1]["event"] == "end" and events[-1]["exit_code"] == 130, events[-1]
    assert "stopping ranks 0,1: waiting up to 20 s for them to exit (Ctrl-C kills at once)" in text, text
    assert "received SIGINT while stopping: killing ranks 0,1 now" in text, text
