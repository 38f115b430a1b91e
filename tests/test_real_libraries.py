"""Real training libraries, unmodified, under mbr-launch (issue #28): PyTorch Lightning (Trainer, DDP, ModelCheckpoint)
and the Hugging Face Trainer (with accelerate under it). CPU, 2 ranks over gloo, tiny models built in the scripts,
random data, no downloads. The test extra of pyproject.toml installs the libraries (scripts/setup); a machine
without them skips these tests, saying which library is missing.

For each library one launch, two faults, each after a checkpoint (the library saves every 10 steps, 40 steps in all):
- attempt 0: rank 1 SIGKILLs itself at step 25: mbr-launch restarts the job, the library resumes from its own
  checkpoint of step 20;
- attempt 1: rank 1 SIGSTOPs itself at step 35 (a hang, no exit): zero-code step heartbeats (--step-timeout) catch
  it, the verdict names the stopped rank, and attempt 2 resumes from step 30 and finishes.
Goodput counts only the steps after each checkpoint as lost (autobeat marks the library's torch.save).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from testkit.helpers import SCRIPTS, launcher_env, run_events, run_launcher

pytestmark = [pytest.mark.processes, pytest.mark.timeout(360)]

MAX_STEPS, SAVE_EVERY = 40, 10
KILL_STEP, STOP_STEP = 25, 35  # on attempts 0 and 1
STEP_TIMEOUT = 10
# Library imports dominate a run (lightning pulls in torch._dynamo and torchmetrics, ~5 s of CPU per rank): about
# 30 s a test on a quiet 2-core machine, several times that on a busy one.
LAUNCH_TIMEOUT = 300

LIBRARIES = {
    # name: (modules that must import, script, its output-directory flag, the name in its last line)
    "lightning": (("lightning",), "lightning_train.py", "--ckpt-dir", "lightning"),
    "hf-trainer": (("transformers", "accelerate"), "hf_train.py", "--output-dir", "hf"),
}


def _launch(tmp_path: Path, library: str):
    modules, script, out_flag, _ = LIBRARIES[library]
    for module in modules:
        pytest.importorskip(module, reason=f"{module} is not installed (the test extra of pyproject.toml has it)")
    env = launcher_env(HF_HOME=str(tmp_path / "hf-home"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    for name in [n for n in env if n.startswith("SLURM_")]:
        del env[name]  # inside a Slurm allocation Lightning would take SLURMEnvironment over torchelastic's
    args = ["--standalone", "--nproc-per-node", "2", "--max-restarts", "2", "--log-dir", str(tmp_path / "logs"),
            "--skip-check", "all", "--status", "off", "--shutdown-timeout", "3", "--hang-kill-grace", "1",
            "--step-timeout", str(STEP_TIMEOUT), str(SCRIPTS / script), out_flag, str(tmp_path / "ckpt"),
            "--max-steps", str(MAX_STEPS), "--save-every", str(SAVE_EVERY),
            "--kill-rank", "1", "--kill-at-step", str(KILL_STEP), "--kill-restart", "0",
            "--stop-rank", "1", "--stop-at-step", str(STOP_STEP), "--stop-restart", "1"]
    res = run_launcher(args, timeout=LAUNCH_TIMEOUT, env=env)
    out = f"stdout:\n{res.stdout[-4000:]}\nstderr:\n{res.stderr[-8000:]}"
    assert res.returncode == 0, out
    return res, run_events(tmp_path / "logs"), out


def _checkpoint_bounds_lost_work(events: list[dict]) -> None:
    """Each library checkpoint (a torch.save of a dict, seen by autobeat) bounds what the failure after it cost."""
    assert [e["restart_count"] for e in events if e["event"] == "restart"] == [1, 2]
    segments = [e for e in events if e["event"] == "progress"]
    assert [(e["cause"], e["steps"]) for e in segments] == [
        ("failure", KILL_STEP), ("failure", STOP_STEP - 20), ("end", MAX_STEPS - 30)], segments
    (good,) = [e for e in events if e["event"] == "goodput"]
    assert len(good["failures"]) == 2, good
    for segment, cost in zip(segments, good["failures"]):
        assert segment["checkpoint"] is not None, f"no checkpoint mark from the library's save: {segment}"
        assert segment["first_step"] < segment["checkpoint"] <= segment["last_step"], segment
        assert cost["lost"] == pytest.approx(segment["last_step"] - segment["checkpoint"], abs=0.01), (segment, cost)
        assert cost["lost"] < segment["last_step"] - segment["first_step"], (segment, cost)
        assert cost["resumed"] is True, cost


@pytest.mark.parametrize("library", sorted(LIBRARIES))
def test_a_killed_then_a_stopped_rank_each_resume_from_the_library_checkpoint(tmp_path, library):
    res, events, out = _launch(tmp_path, library)
    name = LIBRARIES[library][3]
    assert f"rank 1 SIGKILL at step {KILL_STEP}" in res.stdout, out
    assert f"rank 1 SIGSTOP at step {STOP_STEP}" in res.stdout, out
    # attempt 0 started fresh; 1 and 2 restored the library's own checkpoints of steps 20 and 30, on both ranks
    for rank in (0, 1):
        for restart, step in ((0, 0), (1, 20), (2, 30)):
            assert f"rank {rank} restart {restart} starts at step {step}" in res.stdout, out
    done = re.findall(rf"{name} done: global_step=(\d+) resumed=(\w+) restart=(\d+)", res.stdout)
    assert done == [(str(MAX_STEPS), "True", "2")], out
    failures = [e for e in events if e["event"] == "failure"]
    assert [(e["rank"], e["cause"], e.get("signal"), e["round"]) for e in failures] == [
        (1, "crash", "SIGKILL", 0), (1, "hang", None, 1)], failures
    assert failures[0]["startup"] is False, failures
    # the stop: zero-code (autobeat's optimizer-step heartbeats); either rank's deadline may pass first
    (hang,) = [e for e in events if e["event"] == "hang"]
    assert hang["kind"] == "step" and hang["timeout"] == STEP_TIMEOUT and hang["rank"] in (0, 1), hang
    (verdict,) = [e for e in events if e["event"] == "verdict"]
    assert (verdict["culprits"], verdict["basis"]) == ([1], "stopped"), verdict
    assert "is stopped (SIGSTOP" in res.stderr
    _checkpoint_bounds_lost_work(events)
