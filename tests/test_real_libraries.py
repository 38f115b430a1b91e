"""Real training libraries, unmodified, under mbr-launch (issue #28): PyTorch Lightning (Trainer, DDP, ModelCheckpoint)
and the Hugging Face Trainer (with accelerate under it). CPU, 2 ranks over gloo, tiny models built in the scripts,
random data, no downloads. The test extra of pyproject.toml installs the libraries (scripts/setup); a machine
without them skips these tests, saying which library is missing.

For each library, two faults on the first attempt, both after the checkpoint at step 20 of 40:
- rank 1 SIGKILLs itself at step 25: mbr-launch restarts the job, the library resumes from its own checkpoint and
  finishes; goodput counts only the steps after that checkpoint as lost (autobeat marks the library's torch.save);
- rank 1 SIGSTOPs itself at step 25 (a hang, no exit): zero-code step heartbeats (--step-timeout) catch it, the
  verdict names the stopped rank, and the restarted job resumes and finishes.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from testkit.helpers import SCRIPTS, launcher_env, run_events, run_launcher

pytestmark = [pytest.mark.processes, pytest.mark.timeout(360)]

MAX_STEPS, SAVE_EVERY, FAULT_STEP = 40, 10, 25
RESUMED_AT = FAULT_STEP // SAVE_EVERY * SAVE_EVERY  # the last checkpoint before the fault: step 20
STEP_TIMEOUT = 10
# Library imports dominate a run (lightning pulls in torch._dynamo and torchmetrics, ~5 s of CPU per rank): about
# 30 s a test on a quiet 2-core machine, several times that on a busy one.
LAUNCH_TIMEOUT = 300

LIBRARIES = {
    # name: (modules that must import, script, its output-directory flag, the name in its last line)
    "lightning": (("lightning",), "lightning_train.py", "--ckpt-dir", "lightning"),
    "hf-trainer": (("transformers", "accelerate"), "hf_train.py", "--output-dir", "hf"),
}


def _launch(tmp_path: Path, library: str, fault: str) -> tuple[object, list[dict]]:
    modules, script, out_flag, _ = LIBRARIES[library]
    for module in modules:
        pytest.importorskip(module, reason=f"{module} is not installed (the test extra of pyproject.toml has it)")
    env = launcher_env(HF_HOME=str(tmp_path / "hf-home"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    for name in [n for n in env if n.startswith("SLURM_")]:
        del env[name]  # inside a Slurm allocation Lightning would take SLURMEnvironment over torchelastic's
    args = ["--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--log-dir", str(tmp_path / "logs"),
            "--skip-check", "all", "--status", "off", "--shutdown-timeout", "3", "--hang-kill-grace", "1"]
    if fault == "stop":
        args += ["--step-timeout", str(STEP_TIMEOUT)]
    args += [str(SCRIPTS / script), out_flag, str(tmp_path / "ckpt"), "--max-steps", str(MAX_STEPS),
             "--save-every", str(SAVE_EVERY), f"--{fault}-rank", "1", f"--{fault}-at-step", str(FAULT_STEP)]
    res = run_launcher(args, timeout=LAUNCH_TIMEOUT, env=env)
    out = f"stdout:\n{res.stdout[-4000:]}\nstderr:\n{res.stderr[-8000:]}"
    assert res.returncode == 0, out
    return res, run_events(tmp_path / "logs")


def _resumed_and_finished(res, library: str, signal: str) -> None:
    name = LIBRARIES[library][3]
    out = f"stdout:\n{res.stdout[-4000:]}\nstderr:\n{res.stderr[-8000:]}"
    assert f"rank 1 {signal} at step {FAULT_STEP}" in res.stdout, out
    # the first attempt started fresh; the second restored the library's own checkpoint of step 20 on both ranks
    for rank in (0, 1):
        assert f"rank {rank} restart 0 starts at step 0" in res.stdout, out
        assert f"rank {rank} restart 1 starts at step {RESUMED_AT}" in res.stdout, out
    done = re.findall(rf"{name} done: global_step=(\d+) resumed=(\w+) restart=(\d+)", res.stdout)
    assert done == [(str(MAX_STEPS), "True", "1")], out


def _checkpoint_bounds_lost_work(events: list[dict]) -> None:
    """The library's checkpoint (a torch.save of a dict, seen by autobeat) bounds what the failure cost."""
    assert [e["restart_count"] for e in events if e["event"] == "restart"] == [1]
    segments = [e for e in events if e["event"] == "progress"]
    assert len(segments) == 2, segments
    first, second = segments
    assert first["cause"] == "failure" and first["steps"] == FAULT_STEP, first
    assert second["cause"] == "end" and second["steps"] == MAX_STEPS - RESUMED_AT, second
    assert first["checkpoint"] is not None, f"no checkpoint mark from the library's save: {first}"
    assert first["first_step"] < first["checkpoint"] <= first["last_step"], first
    (good,) = [e for e in events if e["event"] == "goodput"]
    (cost,) = good["failures"]
    assert cost["lost"] == pytest.approx(first["last_step"] - first["checkpoint"], abs=0.01), (first, cost)
    assert cost["lost"] < first["last_step"] - first["first_step"], (first, cost)
    assert cost["resumed"] is True, cost


@pytest.mark.parametrize("library", sorted(LIBRARIES))
def test_sigkill_of_a_rank_restarts_and_resumes_from_the_library_checkpoint(tmp_path, library):
    res, events = _launch(tmp_path, library, "kill")
    _resumed_and_finished(res, library, "SIGKILL")
    failures = [e for e in events if e["event"] == "failure"]
    assert [(e["rank"], e["cause"], e["signal"], e["startup"]) for e in failures] == [(1, "crash", "SIGKILL", False)]
    assert not [e for e in events if e["event"] in ("hang", "verdict")]
    _checkpoint_bounds_lost_work(events)


@pytest.mark.parametrize("library", sorted(LIBRARIES))
def test_sigstopped_rank_is_caught_by_step_heartbeats_and_the_job_resumes(tmp_path, library):
    res, events = _launch(tmp_path, library, "stop")
    _resumed_and_finished(res, library, "SIGSTOP")
    (hang,) = [e for e in events if e["event"] == "hang"]
    # zero-code: autobeat's optimizer-step heartbeats; either rank's deadline may pass first
    assert hang["kind"] == "step" and hang["timeout"] == STEP_TIMEOUT and hang["rank"] in (0, 1), hang
    (verdict,) = [e for e in events if e["event"] == "verdict"]
    assert (verdict["culprits"], verdict["basis"]) == ([1], "stopped"), verdict
    failures = [e for e in events if e["event"] == "failure"]
    assert [(e["rank"], e["cause"]) for e in failures] == [(1, "hang")], failures
    assert "is stopped (SIGSTOP" in res.stderr
    _checkpoint_bounds_lost_work(events)
