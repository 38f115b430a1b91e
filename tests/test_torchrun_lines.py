"""torchrun's command lines as its users write them (issue 38): abbreviated options, a --rdzv-conf with the quotes
inside the argument, --logs-specs default, --log-line-prefix-template (and TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE)
on the console and in the filtered files, while the per-rank files keep what the rank wrote, as torch's do.
The unit tests run no process; the launches are real (``python -m mbr_launch`` with real workers)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from mbr_launch.cli import app
from mbr_launch.config.settings import resolve
from mbr_launch.workers.output import rank_prefix

from testkit.helpers import REPO, launcher_env

# One write per line: workers run unbuffered (python -u), so print("out", rank, ...) would be five writes, and the
# console ends a rank's unfinished line when another rank's output comes in between (what these tests do not test).
WORKER = """\
import os, sys
sys.stdout.write(f"out {os.environ['RANK']} {sys.argv[1:]}\\n")
sys.stderr.write(f"err {os.environ['RANK']}\\n")
"""
QUOTED = "'join_timeout=5,last_call_timeout=1,timeout=5'"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("template,expected", [
    ("", b"[rank3]:"),
    ("${hostname}:${rank}: ", b"node7:3: "),
    ("[${role_name}${local_rank}]:", b"[trainer1]:"),  # torch's own default for tee'd lines
    ("$rank/${nope}/$$", b"3/${nope}/$"),  # string.Template, as torch: unknown macros stay, $$ is $
])
def test_rank_prefix(template, expected):
    assert rank_prefix(template, rank=3, local_rank=1, role="trainer", hostname="node7") == expected


@pytest.mark.timeout(30)
def test_template_flag_and_environment_precedence():
    env = {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[e${rank}]", "PET_LOG_LINE_PREFIX_TEMPLATE": ""}
    assert resolve({}, env, {}).values["log_line_prefix_template"] == "[e${rank}]"  # torchrun: flag or env
    assert resolve({}, {**env, "PET_LOG_LINE_PREFIX_TEMPLATE": "[p]"}, {}).values["log_line_prefix_template"] == "[p]"
    assert resolve({"log_line_prefix_template": "[c]"}, env, {}).values["log_line_prefix_template"] == "[c]"


@pytest.mark.timeout(30)
def test_print_completion(capsys):
    assert app._dispatch(["--print-compl", "bash"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# bash completion for mbr-launch.") and "complete -F _mbr_launch_complete mbr-launch" in out
    assert (REPO / "completions" / "mbr-launch.bash").read_text() == out  # the file docgen writes


def _launch(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    script = tmp_path / "w.py"
    script.write_text(WORKER)
    return subprocess.run([sys.executable, "-m", "mbr_launch", *args, str(script), "--nproc", "5"],
                          capture_output=True, text=True, timeout=90, cwd=REPO, env=launcher_env(**(env or {})))


def _rank_files(log_dir: Path, name: str) -> dict[str, str]:
    return {p.parent.name: p.read_text() for p in log_dir.glob(f"*/attempt_0/*/{name}")}


@pytest.mark.processes
@pytest.mark.timeout(120)
def test_a_torchrun_line_with_abbreviations_quotes_and_a_template(tmp_path):
    logs = tmp_path / "logs"
    host = socket.gethostname()
    out = _launch(tmp_path, "--nproc=2", "--redirect=3", "--tee=3", "--standal", "--max_restart=0",
                  "--log_line_prefix_template", "${hostname}:${rank}/${local_rank}:${role_name}| ",
                  "--rdzv-conf", QUOTED, "--logs_specs=default", "--log-d", str(logs), "--skip-check", "all", "-q")
    assert out.returncode == 0, out.stderr
    # the script's own --nproc 5 reached it untouched
    assert sorted(out.stdout.splitlines()) == [f"{host}:{r}/{r}:default| out {r} ['--nproc', '5']" for r in (0, 1)]
    err = out.stderr.splitlines()
    assert sorted(line for line in err if "| err" in line) == [f"{host}:{r}/{r}:default| err {r}" for r in (0, 1)]
    said = [line for line in err if "rdzv-conf" in line]
    assert len(said) == 1 and "does not read \"'join_timeout\", 'timeout'" in said[0], err
    assert _rank_files(logs, "stdout.log") == {str(r): f"out {r} ['--nproc', '5']\n" for r in (0, 1)}
    assert _rank_files(logs, "stderr.log") == {str(r): f"err {r}\n" for r in (0, 1)}


@pytest.mark.processes
@pytest.mark.timeout(120)
def test_the_template_from_the_environment_reaches_the_filtered_files(tmp_path):
    logs = tmp_path / "logs"
    out = _launch(tmp_path, "--nproc_per=2", "--standalone", "--duplicate_stdout", "out", "--log-dir", str(logs),
                  "--skip-check", "all", "-q", env={"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "<${rank}> "})
    assert out.returncode == 0, out.stderr
    assert sorted(out.stdout.splitlines()) == [f"<{r}> out {r} ['--nproc', '5']" for r in (0, 1)]
    filtered = [p.read_text() for p in logs.glob("*/filtered_stdout.log")]
    assert len(filtered) == 1 and sorted(filtered[0].splitlines()) == sorted(out.stdout.splitlines())
