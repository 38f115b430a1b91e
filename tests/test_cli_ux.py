"""What a newcomer sees from the command line, run for real (``python -m mbr_launch`` subprocesses):

- ``--help`` fits 80 columns with nothing cut off, common options first, choices and ranges shown,
  ``--help-all`` for the rest, subcommands listed; ``--version``; the versions in ``doctor`` (text and
  JSON) and in the ``start`` event;
- a quiet preflight (one line for warnings, errors in full), ``launcher.per_node`` counting only this
  user's real launches that share this job's rendezvous or GPUs, the doctor's report grouped by area with
  the skips folded, and ``doctor --deep`` running a gloo all-reduce without a GPU.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from mbr_launch.config.settings import SETTINGS

from .conftest import REPO
from testkit.helpers import free_port, launcher_env, run_launcher

pytestmark = [pytest.mark.timeout(120), pytest.mark.processes]
COLS = 80
VERSION = re.compile(r"^mbr-launch \d+\.\d+\.\d+\S* \(torch \S+, nvidia-resiliency-ext \S+, python \d+\.\d+\.\d+\)$")
# The versions checks import torch (seconds on a loaded machine); the tests below that do not look at them
# skip them. The versions of the report come from package metadata either way.
NO_TORCH = ("--skip-check", "versions.torch,versions.nccl,versions.nvrx")
PREFLIGHT = re.compile(r"^preflight: \d+ warnings?; run `mbr-launch doctor` for details$")


def _cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**(env or launcher_env()), "COLUMNS": str(COLS), "NO_COLOR": "1", "TERM": "dumb"}
    return subprocess.run([sys.executable, "-m", "mbr_launch", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env=env)


def _fits(text: str) -> None:
    long = [line for line in text.splitlines() if len(line) > COLS]
    assert not long, f"{len(long)} line(s) wider than {COLS} columns: {long[:3]}"
    assert "…" not in text, "something was cut off"


def _has_gpu() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except ImportError:
        return False


# ---- finding 5: help, version, completions (test_docs.py) -----------------------------------------


def test_help_is_readable_at_80_columns():
    short = _cli("--help")
    assert short.returncode == 0, short.stderr
    text = short.stdout
    _fits(text)
    lines = text.splitlines()
    assert lines[0] == "Usage: mbr-launch [OPTIONS] SCRIPT [ARGS]...", lines[0]
    assert "       mbr-launch doctor [OPTIONS] [SCRIPT [ARGS]...]" in lines  # subcommands listed
    assert re.search(r"^Commands:\n  doctor ", text, re.M)
    assert len(lines) < 120, f"--help is {len(lines)} lines"
    # Choices, ranges and switches as such; typer's type names never.
    assert "--status {auto,live,plain,off}" in text and "--max-restarts N [0..]" in text
    assert re.search(r"^  --standalone$", text, re.M) and "<bool>" not in text and "<str>" not in text
    assert "--rdzv-backend {c10d,static}" in text and "--nproc-per-node {N,auto,cpu,gpu,xpu}" in text
    assert "--help-all" in text and "--version" in text
    assert "--max_restarts\n" not in text and "--nproc_per_node " not in text  # one spelling each
    assert [s.name for s in SETTINGS if s.common and s.flag not in text] == []

    everything = _cli("--help-all")
    assert everything.returncode == 0, everything.stderr
    _fits(everything.stdout)
    visible = [s for s in SETTINGS if not s.hidden]
    missing = [s.name for s in visible if s.shown_flags[0] not in everything.stdout]
    assert not missing, missing
    missing_env = [e for s in visible for e in s.envvars if e not in everything.stdout]
    assert not missing_env, missing_env
    assert "--ft-rank-heartbeat-timeout" in everything.stdout  # ft_launcher's spelling, once

    doctor = _cli("doctor", "--help")
    assert doctor.returncode == 0, doctor.stderr
    _fits(doctor.stdout)
    assert doctor.stdout.startswith("Usage: mbr-launch doctor [OPTIONS]")
    assert "--deep" in doctor.stdout and "--verbose" in doctor.stdout and "--json" in doctor.stdout


def test_version_everywhere_and_aliases_still_accepted(tmp_path: Path):
    """--version; the versions in doctor's text and JSON and in the start event of a real launch, which
    also uses torchrun's underscore spellings (accepted, only not offered) and prints a quiet preflight."""
    out = _cli("--version")
    assert out.returncode == 0 and VERSION.match(out.stdout.strip()), out
    line = out.stdout.strip()
    report = json.loads(_cli("doctor", "--json", *NO_TORCH).stdout)
    assert set(report["versions"]) == {"mbr-launch", "torch", "nvidia-resiliency-ext", "python"}
    assert report["versions"]["mbr-launch"] in line

    script = tmp_path / "hello.py"
    script.write_text("print('hello from the script')\n")
    run = run_launcher(["--nproc_per_node", "1", "--max_restarts", "0", "--standby", "off", "--status", "off",
                        "--log_dir", str(tmp_path / "logs"), str(script)], timeout=90)
    assert run.returncode == 0, run.stderr
    assert "hello from the script" in run.stdout
    events = [json.loads(x) for f in (tmp_path / "logs").rglob("events.jsonl") for x in f.read_text().splitlines()]
    start = next(e for e in events if e["event"] == "start")
    assert start["version"] == report["versions"], start
    _quiet_preflight(run.stderr)


# ---- finding 6: preflight, per_node, doctor report, --deep --------------------------------------


def _quiet_preflight(stderr: str) -> None:
    """No warning is printed in full before a launch: at most one preflight line."""
    lines = stderr.splitlines()
    assert not [x for x in lines if x.startswith(("warn ", "    fix:"))], stderr
    assert len([x for x in lines if x.startswith("preflight:")]) <= 1, stderr
    assert all(PREFLIGHT.match(x) for x in lines if x.startswith("preflight:")), stderr


def _fake(where: Path, name: str, *args: str, env: dict[str, str], **kw) -> subprocess.Popen:
    """A real process whose command line is ``/bin/sh <dir>/NAME ARGS...``, as `ps` shows another
    launcher (its own session, so that killing the group also ends its sleep)."""
    exe = where / name
    exe.write_text("#!/bin/sh\nsleep 120\n")
    exe.chmod(0o755)
    return subprocess.Popen([str(exe), *args], env=env, start_new_session=True, **kw)


def test_preflight_is_one_line_and_counts_only_launches_that_get_in_the_way(tmp_path: Path):
    port, other_port = free_port(), free_port()
    env = launcher_env(PET_MASTER_PORT=str(port))
    theirs = {**env, "CUDA_VISIBLE_DEVICES": "7"}
    ours = {**env, "CUDA_VISIBLE_DEVICES": "0"}
    fakes: dict[str, subprocess.Popen] = {}
    shared = Path(tempfile.mkdtemp(prefix="mbr-cli-ux-"))  # another user must be able to run the fake
    shared.chmod(0o755)
    try:
        # Same rendezvous as ours: a second launch of this job on this node.
        fakes["same_job"] = _fake(tmp_path, "torchrun", "--master-port", str(port), "--nproc-per-node", "1",
                                  "t.py", env=theirs)
        fakes["help"] = _fake(tmp_path, "ft_launcher", "--help", env=theirs)
        fakes["doctor"] = _fake(tmp_path, "mbr-launch", "doctor", "--deep", env=theirs)
        # Another job of ours with its own rendezvous and other GPUs: no business of this launch.
        fakes["other_job"] = _fake(tmp_path, "torchrun", "--master-port", str(other_port), "t.py", env=theirs)
        if os.getuid() == 0:  # someone else's launch on our port: theirs to sort out, not reported here
            fakes["other_user"] = _fake(shared, "torchrun", "--master-port", str(port), "t.py", env=theirs,
                                        user=65534, cwd="/")

        doctor = _cli("doctor", "--json", *NO_TORCH, env=ours)
        check = next(c for c in json.loads(doctor.stdout)["checks"] if c["id"] == "launcher.per_node")
        assert check["severity"] == "warn", check
        assert f"pid {fakes['same_job'].pid} uses the same rendezvous" in check["saw"], check
        for name in ("help", "doctor", "other_job", "other_user"):
            if name in fakes:
                assert f"pid {fakes[name].pid} " not in check["saw"], (name, check)
        if not _has_gpu():
            assert "CUDA_VISIBLE_DEVICES" not in check["fix"], check  # no GPU: nothing to hide

        script = tmp_path / "hello.py"
        script.write_text("print('hello')\n")
        run = run_launcher(["--standby", "off", "--status", "off", str(script)], env=ours, timeout=90)
        assert run.returncode == 0, run.stderr
        assert [x for x in run.stderr.splitlines() if PREFLIGHT.match(x)], run.stderr  # the warning, folded
        _quiet_preflight(run.stderr)
        # Whole words only: a run id such as 20261201-075531 or hex suffix may contain the pid's digits by chance.
        assert not re.search(r"(?<![\w./-])t\.py\b", run.stderr), run.stderr
        assert not re.search(rf"(?<!\w){fakes['same_job'].pid}(?!\w)", run.stderr), run.stderr
    finally:
        for proc in fakes.values():
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        shutil.rmtree(shared, ignore_errors=True)

    # An error is still printed in full, with its fix, and stops the launch (exit 2).
    step = {**ours, "SLURM_STEP_ID": "0", "SLURM_STEP_TASKS_PER_NODE": "2"}
    run = run_launcher(["--standby", "off", "--slurm", "off", str(script)], env=step, timeout=60)
    assert run.returncode == 2, run
    assert "error launcher.per_node: 2 launchers per node" in run.stderr and "fix: start one launcher" in run.stderr
    assert "hello" not in run.stdout


def test_doctor_groups_areas_and_folds_skips():
    plain = _cli("doctor", *NO_TORCH)
    assert plain.returncode in (0, 1), plain.stderr
    _fits(plain.stdout)
    lines = plain.stdout.splitlines()
    version = _cli("--version").stdout.strip()
    assert " ".join(lines[:2]).startswith(version), lines[:2]  # the versions head the report
    assert not [x for x in lines if x.startswith("  skip ")], "skips are folded"
    assert "Launcher" in lines and "Versions" in lines  # grouped under area headings
    assert re.search(r"^  \d+ skipped \(", plain.stdout, re.M)
    if not _has_gpu():
        # gpu.count, gpu.memory, gpu.recovery, gpu.strangers
        assert re.search(r"^GPUs\n  4 skipped \(no GPU\)$", plain.stdout, re.M), plain.stdout
    assert len(lines) < 60, f"{len(lines)} lines"
    verbose = _cli("doctor", "--verbose", *NO_TORCH)
    skipped = int(re.search(r"(\d+) skipped", verbose.stdout.splitlines()[-1]).group(1))
    assert len([x for x in verbose.stdout.splitlines() if x.startswith("  skip ")]) == skipped > 0


@pytest.mark.skipif(_has_gpu(), reason="with a GPU --deep runs NCCL instead")
@pytest.mark.timeout(200)  # ~5 s on an idle machine; three torch imports take far longer on a loaded one
def test_doctor_deep_runs_gloo_without_gpu():
    out = _cli("doctor", "--deep", "--json", timeout=180)
    report = json.loads(out.stdout)
    deep = [c for c in report["checks"] if c["id"].startswith("deep.")]
    assert [c["id"] for c in deep] == ["deep.gloo"] and deep[0]["severity"] == "ok", deep
    assert re.search(r"2 processes: all-reduce of 4 MiB correct, [\d.]+ ms each", deep[0]["saw"]), deep


def test_deep_gloo_reports_a_timeout_as_an_error():
    """Ranks that cannot finish in time (here: not even import torch in 0.3 s) are killed and reported."""
    from mbr_launch.doctor.deep_cpu import run_gloo

    [result] = run_gloo(world=2, timeout_s=0.3)
    assert result.severity == "error" and "did not finish within 0.3 s" in result.saw, result
