"""Every example runs (the sbatch one runs on the Slurm test cluster in test_slurm_launch.py)."""

from __future__ import annotations

import pytest

from testkit.eventlog import read_events

from testkit.helpers import REPO, run_launcher

pytestmark = [pytest.mark.timeout(150), pytest.mark.processes]


def test_plain_example_recovers_from_an_injected_crash(tmp_path):
    """What `bash scripts/demo` runs."""
    res = run_launcher(["--standalone", "--nproc-per-node", "2", "--max-restarts", "2",
                        str(REPO / "examples/train_plain.py"), "--steps", "40", "--fault-step", "25",
                        "--ckpt-dir", str(tmp_path / "ckpt")])
    assert res.returncode == 0, res.stderr
    assert "injecting a crash at step 25" in res.stdout
    assert "[attempt 1] resumed from step 20" in res.stdout
    assert "[attempt 1] finished 40 steps on 2 ranks" in res.stdout


def test_megatron_style_example_hang_caught_by_saved_timeouts(tmp_path):
    res = run_launcher(["--standalone", "--nproc-per-node", "2", "--max-restarts", "2", "--log-dir", str(tmp_path),
                        "--ft-safety-factor", "20", "--ft-rank-section-timeouts", "setup:600,step:180,checkpointing:420",
                        "--ft-rank-out-of-section-timeout", "300",
                        str(REPO / "examples/train_megatron_style.py"), "--iters", "40", "--hang-at", "25",
                        "--ckpt-dir", str(tmp_path / "ckpt")])
    assert res.returncode == 0, res.stderr
    assert "calculated timeouts: step" in res.stdout
    assert "[attempt 1] finished 40 iterations" in res.stdout
    events = read_events(next(tmp_path.glob("*/events.jsonl")))
    hangs = [e for e in events if e["event"] == "hang"]
    assert len(hangs) == 1 and hangs[0]["timeout"] < 60  # the calculated timeout, not the configured 180 s
    assert any(e["event"] == "stacks" for e in events)
