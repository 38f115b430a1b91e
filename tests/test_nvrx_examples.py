"""NVRx v0.4.1's own fault-tolerance examples, unmodified (third_party/nvrx-v0.4.1), run under mbr-launch the
way NVRx's docs run them under ft_launcher:

    ft_launcher --nproc-per-node=2 --ft-cfg-path=fault_tol_cfg_heartbeats.yaml train_ddp_heartbeats_api.py --device=cpu
    ft_launcher --nproc-per-node=2 --ft-cfg-path=fault_tol_cfg_sections.yaml train_ddp_sections_api.py --device=cpu

with ft_launcher's own flags added for a test (a rendezvous port of the test's, --max-restarts, --log-dir,
--ft-safety-factor: the examples calculate section timeouts as a multiple of what they observed, and on a
loaded 2-core machine a barrier can wait 5x its observed 0.1 s; --workers-stop-timeout: the scripts catch
SIGTERM and go on until a collective fails, 9 s here), and the scripts' own arguments shortened.

The faults are the ones the scripts' ``--simulated_fault`` injects (a rank SIGKILLed; a rank SIGSTOPped),
sent by the test at a chosen moment instead: the scripts arm theirs only at an epoch's end, after a random
0-4 s delay, so landing it in a short run would need epochs of more than 4 s each (about a minute per test
here). The test sends the same signal to the same kind of target once the script has reached the state its
own injection waits for (heartbeat timeouts calculated; section timeouts calculated).

Each test is its own function, so more examples (the in-job + in-process one) can be added beside them.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from mbr_launch.report.events import read_events

from .helpers import REPO, start_launcher

pytestmark = pytest.mark.timeout(180)

EXAMPLES = REPO / "third_party/nvrx-v0.4.1/examples/fault_tolerance"
# Short epochs: 160 steps of 8 samples on each of 2 ranks, a tiny model, a tiny validation set.
SHORT = ["--device=cpu", "--hidden=64", "--batch=8", "--train_dataset_size=2560", "--val_dataset_size=64",
         "--logging_interval=10"]


def _in_epoch(epoch: int) -> re.Pattern[str]:
    """Rank 0's log line of a training step past the first of ``epoch``."""
    return re.compile(rf"CHECK TRAIN epoch:\s+{epoch} iter:\s+[1-9]\d*\b")


class Launch:
    """A running mbr-launch whose output is collected by two threads, so the test can watch for a line."""

    def __init__(self, args: list[str]) -> None:
        self.proc = start_launcher(args)
        self.out: list[str] = []
        self.err: list[str] = []
        self._seen: list[tuple[re.Pattern[str], threading.Event]] = []
        self._lock = threading.Lock()
        self._pumps = [threading.Thread(target=self._pump, args=(self.proc.stdout, self.out), daemon=True),
                       threading.Thread(target=self._pump, args=(self.proc.stderr, self.err), daemon=True)]
        for pump in self._pumps:
            pump.start()

    def _pump(self, stream, sink: list[str]) -> None:
        for line in stream:
            with self._lock:
                sink.append(line)
                for pattern, event in self._seen:
                    if pattern.search(line):
                        event.set()

    def wait_for(self, pattern: re.Pattern[str], timeout: float) -> None:
        event = threading.Event()
        with self._lock:
            self._seen.append((pattern, event))
            if any(pattern.search(line) for line in self.out + self.err):
                event.set()
        if not event.wait(timeout):
            self.kill()
            raise AssertionError(f"{pattern.pattern!r} not seen within {timeout} s\n{self.text()}")

    def finish(self, timeout: float) -> int:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"launcher did not finish within {timeout} s\n{self.text()}") from None
        for pump in self._pumps:
            pump.join(timeout=10)
        return code

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)

    def text(self) -> str:
        return "stdout:\n" + "".join(self.out[-80:]) + "\nstderr:\n" + "".join(self.err[-80:])


def _example_args(tmp_path: Path, port: int, cfg: str, script: str, epochs: int) -> list[str]:
    return ["--nproc-per-node=2", f"--ft-cfg-path={EXAMPLES / cfg}", "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{port}", "--max-restarts=2", f"--log-dir={tmp_path / 'logs'}",
            "--ft-safety-factor=20", "--workers-stop-timeout=3", str(EXAMPLES / script), *SHORT, f"--epochs={epochs}",
            f"--output_dir={tmp_path / 'out'}"]


def _events(tmp_path: Path) -> list[dict]:
    return read_events(next((tmp_path / "logs").glob("*/events.jsonl")))


def _worker_pid(tmp_path: Path, rank: int, timeout: float = 10.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        starts = [e for e in _events(tmp_path) if e["event"] == "worker_start" and e["rank"] == rank]
        if starts:
            return starts[-1]["pid"]
        time.sleep(0.1)
    raise AssertionError(f"no worker_start event for rank {rank}")


def test_nvrx_heartbeats_example_recovers_from_a_killed_rank(tmp_path, port):
    """train_ddp_heartbeats_api.py: heartbeats, timeouts it calculates at epoch 1's first step and saves with the
    checkpoint. A rank SIGKILLed in epoch 2, where its --simulated_fault rank_killed lands (it is armed once a
    checkpoint holds valid timeouts: resumed from the epoch-0 checkpoint, the script calls
    calculate_and_set_hb_timeouts after one heartbeat and NVRx's client raises "Not enough data to compute
    timeouts", whatever the launcher), restarts the job, which resumes from the epoch-1 checkpoint and
    finishes."""
    run = Launch(_example_args(tmp_path, port, "fault_tol_cfg_heartbeats.yaml", "train_ddp_heartbeats_api.py", 3))
    run.wait_for(_in_epoch(2), timeout=120)
    os.kill(_worker_pid(tmp_path, rank=1), signal.SIGKILL)
    assert run.finish(timeout=90) == 0, run.text()
    out = "".join(run.out + run.err)  # the scripts log to stderr
    assert "Checkpoint was loaded from file" in out and "Leaving main, ret_code=0" in out, run.text()
    assert re.search(r"CHECK VAL SUMMARY: epoch:\s+2 ", out), run.text()
    events = _events(tmp_path)
    failures = [e for e in events if e["event"] == "failure"]
    assert [(f["rank"], f["cause"], f["signal"]) for f in failures] == [(1, "crash", "SIGKILL")], failures
    assert [e["restart_count"] for e in events if e["event"] == "restart"] == [1]
    assert events[-1]["event"] == "end" and events[-1]["exit_code"] == 0


def test_nvrx_sections_example_recovers_from_a_stopped_rank(tmp_path, port):
    """train_ddp_sections_api.py: init/step/checkpoint sections from its YAML, section timeouts it calculates
    and saves to ft_state.json. A rank SIGSTOPped in epoch 1 (its --simulated_fault rank_hung) is a hang
    caught by those calculated timeouts; the job restarts, loads ft_state.json and the checkpoint, finishes."""
    run = Launch(_example_args(tmp_path, port, "fault_tol_cfg_sections.yaml", "train_ddp_sections_api.py", 2))
    run.wait_for(_in_epoch(1), timeout=120)  # epoch 0 done: step and checkpoint timeouts calculated
    pid = _worker_pid(tmp_path, rank=1)
    os.kill(pid, signal.SIGSTOP)
    try:
        assert run.finish(timeout=120) == 0, run.text()
    finally:
        try:  # the launcher kills it; this only matters when the test fails before that
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    out = "".join(run.out + run.err)  # the scripts log to stderr
    assert "FT state loading from" in out and "Checkpoint was loaded from file" in out, run.text()
    assert "Leaving main, ret_code=0" in out, run.text()
    events = _events(tmp_path)
    hangs = [e for e in events if e["event"] == "hang"]
    assert hangs and all(h["kind"] in ("section", "out_of_section") for h in hangs), hangs
    assert all(h["timeout"] < 10 for h in hangs if h["kind"] == "section"), hangs  # calculated, not the YAML's
    verdicts = [e for e in events if e["event"] == "verdict"]
    assert verdicts and verdicts[0]["culprits"] == [1] and verdicts[0]["basis"] == "stopped", verdicts
    failures = [e for e in events if e["event"] == "failure"]
    assert [(f["rank"], f["cause"]) for f in failures] == [(1, "hang")], failures
    assert [e["restart_count"] for e in events if e["event"] == "restart"] == [1]
    assert events[-1]["event"] == "end" and events[-1]["exit_code"] == 0
