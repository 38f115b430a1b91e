"""Running NVRx's own fault-tolerance examples (vendored unmodified in third_party/nvrx-v<VERSION>) under
mbr-launch the way NVRx's docs run them under ft_launcher, for the tests of each vendored version
(test_nvrx_examples.py, for 0.4.1 and 0.7.0):

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
own injection waits for (heartbeat timeouts calculated; section timeouts calculated)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

from testkit.eventlog import read_events

from .helpers import REPO, launcher_env, start_launcher
from .nvrx_versions import nvrx_env

# Short epochs: 160 steps of 8 samples on each of 2 ranks, a tiny model, a tiny validation set.
SHORT = ["--device=cpu", "--hidden=64", "--batch=8", "--train_dataset_size=2560", "--val_dataset_size=64",
         "--logging_interval=10"]
HEARTBEATS = ("fault_tol_cfg_heartbeats.yaml", "train_ddp_heartbeats_api.py")
SECTIONS = ("fault_tol_cfg_sections.yaml", "train_ddp_sections_api.py")


def examples_dir(version: str) -> Path:
    """The vendored examples of NVRx ``version`` (scripts/vendor-nvrx-examples)."""
    return REPO / f"third_party/nvrx-v{version}/examples/fault_tolerance"


def in_epoch(epoch: int) -> re.Pattern[str]:
    """Rank 0's log line of a training step past the first of ``epoch``."""
    return re.compile(rf"CHECK TRAIN epoch:\s+{epoch} iter:\s+[1-9]\d*\b")


class Launch:
    """A running mbr-launch whose output is collected by two threads, so the test can watch for a line."""

    def __init__(self, args: list[str], *, version: str) -> None:
        self.proc = start_launcher(args, env=example_env(version))
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

    def output(self) -> str:
        """Everything the launcher printed (the scripts log to stderr)."""
        return "".join(self.out + self.err)

    def text(self) -> str:
        return "stdout:\n" + "".join(self.out[-80:]) + "\nstderr:\n" + "".join(self.err[-80:])


def example_args(tmp_path: Path, port: int, version: str, example: tuple[str, str], epochs: int) -> list[str]:
    """mbr-launch's command line for ``example`` (its YAML, its script) of NVRx ``version``."""
    cfg, script = example
    where = examples_dir(version)
    return ["--nproc-per-node=2", f"--ft-cfg-path={where / cfg}", "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{port}", "--max-restarts=2", f"--log-dir={tmp_path / 'logs'}",
            "--ft-safety-factor=20", "--workers-stop-timeout=3", str(where / script), *SHORT, f"--epochs={epochs}",
            f"--output_dir={tmp_path / 'out'}"]


def example_env(version: str) -> dict[str, str]:
    """The launcher's environment with NVRx ``version`` first on PYTHONPATH: the client the workers import."""
    return nvrx_env(version, launcher_env())


def run_events(tmp_path: Path) -> list[dict]:
    """The run's events.jsonl (one launcher, one run folder under --log-dir)."""
    return read_events(next((tmp_path / "logs").glob("*/events.jsonl")))


def worker_pid(tmp_path: Path, rank: int, timeout: float = 10.0) -> int:
    """The pid of ``rank``'s latest worker, from its ``worker_start`` event."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        starts = [e for e in run_events(tmp_path) if e["event"] == "worker_start" and e["rank"] == rank]
        if starts:
            return starts[-1]["pid"]
        time.sleep(0.1)
    raise AssertionError(f"no worker_start event for rank {rank}")


def stop_rank(tmp_path: Path, rank: int) -> int:
    """SIGSTOP ``rank``'s worker (the scripts' ``rank_hung``); returns its pid for ``reap_stopped``."""
    pid = worker_pid(tmp_path, rank)
    os.kill(pid, signal.SIGSTOP)
    return pid


def reap_stopped(pid: int) -> None:
    """The launcher kills a stopped rank; this only matters when a test fails before it does."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def assert_client(events: list[dict], version: str) -> None:
    """The run imported NVRx ``version`` (the launcher's ``start`` event records what its PYTHONPATH gave it,
    and the workers inherit that PYTHONPATH): a test of one client never silently runs another."""
    seen = events[0]["version"]["nvidia-resiliency-ext"]
    assert events[0]["event"] == "start" and seen == version, f"NVRx {seen} ran, not {version}"
