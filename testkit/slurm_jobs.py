"""Helpers for tests that submit mbr-launch jobs to the Slurm test cluster (testkit/slurm_cluster.py):
tests/test_slurm_launch.py and the Slurm cases of the fault matrix (testkit/fault_slurm.py)."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from testkit.eventlog import read_events
from testkit.slurm_cluster import REPO, SlurmCluster

MBR_LAUNCH = str(Path(sys.executable).with_name("mbr-launch"))  # the repo venv's entry point
PREEMPTIBLE = str(REPO / "examples" / "train_preemptible.py")
LAUNCH_ENV = {**os.environ, "PYTHONWARNINGS": "ignore"}


def launch_cmd(*args: str) -> str:
    return shlex.join([MBR_LAUNCH, *args])


def batch(*srun_line: str) -> str:
    """A batch script that runs one srun step and exits with its code."""
    return "#!/bin/bash\n" + " ".join(srun_line) + "\nexit $?\n"


def complete_lines(path: Path) -> list[str]:
    """The complete lines of a file another process may be appending to right now."""
    text = path.read_text() if path.exists() else ""
    return text.split("\n")[:-1]


def agent_events(log_dir: Path) -> dict[str, list[dict]]:
    """Every agent's events, keyed by '<run id>/<node>' (run id carries job, step and requeue count)."""
    found = {}
    for path in sorted(log_dir.glob("*/events.jsonl")):
        events = read_events(path)
        if events:
            found[f"{events[0]['run_id']}/{events[0]['node']}"] = events
    return found


def one_event(events: list[dict], kind: str) -> dict:
    matching = [e for e in events if e["event"] == kind]
    assert len(matching) == 1, f"expected one {kind!r} event, got {matching}"
    return matching[0]


def preempt_log(path: Path) -> list[tuple[int, str, dict[str, str]]]:
    """train_preemptible.py --log lines: (rank, what, {key: value})."""
    rows = []
    for line in complete_lines(path):
        rank, what, *rest = line.split()
        rows.append((int(rank), what, dict(item.split("=", 1) for item in rest)))
    return rows


def wait_running(cluster: SlurmCluster, log: Path, ranks: int, job: str) -> None:
    """Until every rank of the job's first run has finished its first training step."""
    def running() -> bool:
        state = cluster.job(job).get("JobState")
        if state not in ("PENDING", "RUNNING", "CONFIGURING"):
            raise AssertionError(f"job {job} is {state} before its training ran")
        return sum(1 for _r, what, kv in preempt_log(log)
                   if what == "running" and kv["slurm_restart"] == "0") == ranks

    cluster.wait_for(f"{ranks} ranks of job {job} training", running, 60)


def wait_gone(cluster: SlurmCluster, job: str, timeout: float) -> dict[str, str]:
    cluster.wait_for(f"job {job} to end", lambda: all(j["id"] != job for j in cluster.squeue()), timeout)
    return cluster.job(job)
