"""Secrets a same-host user could read in what the launcher writes (issue 29, "Secrets"): flag spellings the first
redaction missed, Hydra overrides, URL passwords, py-spy's command line in a hung rank's stack file, the
command lines of leftover processes and of other launches in ``mbr-launch doctor``; and the words that only
look like secrets (``--tokenizer``) are kept, so that a redacted command line still says what ran."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time

import pytest

from mbr_launch.doctor import DoctorContext, run_checks, to_json
from mbr_launch.doctor.probes import NvmlView, Versions
from mbr_launch.doctor.processes import LauncherProcess
from mbr_launch.health import leftovers
from mbr_launch.report import redact
from mbr_launch.report.redact import REDACTED, redact_argv
from mbr_launch.workers import stacks
from mbr_launch.workers.stacks import StackTarget, dump_stacks

pytestmark = pytest.mark.timeout(60)

R = REDACTED


@pytest.mark.parametrize("flag", ["--auth", "--passphrase", "--credentials", "--credential", "--private-key",
                                  "--access-key", "--bearer", "--cookie", "--apiKey", "--clientSecret",
                                  "--trainer.logger.api_key", "--token-value"])
def test_more_secret_flags_are_redacted_in_both_spellings(flag):
    assert redact_argv(["train.py", flag, "S3CRET", "--lr", "1"]) == ["train.py", flag, R, "--lr", "1"]
    assert redact_argv(["train.py", f"{flag}=S3CRET"]) == ["train.py", f"{flag}={R}"]


@pytest.mark.parametrize("flag", ["--tokenizer", "--tokenizer-model", "--max-tokens", "--keyframe",
                                  "--num-key-value-heads", "--pad-token-id", "--hf-token-file", "--session"])
def test_words_that_only_look_like_secrets_are_kept(flag):
    argv = ["train.py", flag, "value", f"{flag}=value"]
    assert redact_argv(argv) == argv


@pytest.mark.parametrize(("word", "shown"), [
    ("model.wandb.api_key=K", f"model.wandb.api_key={R}"),
    ("+trainer.wandb_key=K", f"+trainer.wandb_key={R}"),
    ("++exp_manager.hf_token=K", f"++exp_manager.hf_token={R}"),
    ("HF_TOKEN=K", f"HF_TOKEN={R}"),
    ("db/password=K", f"db/password={R}"),
    ("model.tokenizer.model=/data/tok.model", "model.tokenizer.model=/data/tok.model"),
    ("trainer.max_steps=100", "trainer.max_steps=100"),
])
def test_hydra_overrides_and_assignments_whose_key_names_a_secret(word, shown):
    assert redact_argv(["train.py", word]) == ["train.py", shown]


@pytest.mark.parametrize(("word", "shown"), [
    ("https://u:p4ss@host/x", f"https://u:{R}@host/x"),
    ("redis://:p4ss@h:6379/0", f"redis://:{R}@h:6379/0"),
    ("--db=postgres://user:p4ss@db:5432/x", f"--db=postgres://user:{R}@db:5432/x"),
    ("https://u:p@ss@host/", f"https://u:{R}@host/"),
    ("git+https://ghp_abc123@github.com/o/r", f"git+https://{R}@github.com/o/r"),
    ("Authorization: Bearer abc", f"Authorization: {R}"),
    ("ssh://git@github.com/o/r", "ssh://git@github.com/o/r"),
    ("https://host:8080/path?mail=a@b", "https://host:8080/path?mail=a@b"),
])
def test_url_passwords_and_auth_headers(word, shown):
    assert redact_argv(["x", "--url", word]) == ["x", "--url", shown]


def test_a_command_line_as_text_keeps_its_spacing_and_quotes_and_tolerates_a_stray_quote():
    text = "python  train.py --api-key K1 \"--password\" 'a b' x.api_key=K2 --lr 0.1 'stray --token K3"
    assert redact.redact_command_line(text) == (f"python  train.py --api-key {R} \"--password\" {R} x.api_key={R} "
                                         f"--lr 0.1 'stray --token {R}")
    assert redact.redact_command_line("a \"b --secret K4") == f"a \"b --secret {R}"
    assert redact.redact_command_line("trailing backslash \\") == "trailing backslash \\"


def test_a_command_line_as_text_never_raises_and_never_keeps_a_flagged_value():
    pieces = [*"ab -=:/@'\"\\\t\n.+_", "--api-key", "K", "https://", "x.token="]
    rng = random.Random(29)
    for _ in range(2000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randrange(30)))
        assert isinstance(redact.redact_command_line(text), str)
        assert redact.redact_command_line("run --api-key SECRET " + text).startswith(f"run --api-key {R}"), text


# ---- where command lines are written ------------------------------------------------------------------------

FAKE_PY_SPY = """#!/bin/sh
cat <<'EOF'
Process 4321: python -u train.py --hf_token=hf_SECRET1 --wandb-api-key SECRET2 x.api_key=SECRET3 https://u:SECRET4@h/
Python v3.12.3 (/usr/bin/python3.12)

Thread 4321 (idle): "MainThread"
    hang (train.py:3)
    <module> (train.py:5)
EOF
"""


@pytest.mark.processes
def test_py_spy_process_line_is_redacted_in_the_stack_file(tmp_path, monkeypatch):
    fake = tmp_path / "py-spy"
    fake.write_text(FAKE_PY_SPY)
    fake.chmod(0o755)
    monkeypatch.setattr(stacks, "find_py_spy", lambda: str(fake))
    [dump] = dump_stacks([StackTarget(0, 0, os.getpid())], tmp_path / "out", method="py-spy", timeout=20)
    assert dump.method == "py-spy" and dump.path is not None, dump
    text = dump.path.read_text()
    assert "SECRET" not in text, text
    assert (f"Process 4321: python -u train.py --hf_token={R} --wandb-api-key {R} x.api_key={R} https://u:{R}@h/\n"
            "Python v3.12.3 (/usr/bin/python3.12)\n") in text
    assert dump.summary == "hang at train.py:3", dump  # the frames are read as before


@pytest.mark.processes
@pytest.mark.skipif(stacks.find_py_spy() is None, reason="py-spy is not installed")
def test_a_real_py_spy_dump_keeps_no_secret_of_the_command_line(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(600)",
                             "--api-key", "SECRET1", "+trainer.wandb_key=SECRET2"], stdout=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        [dump] = dump_stacks([StackTarget(0, 0, proc.pid)], tmp_path / "out", method="py-spy", timeout=20)
        if dump.method == "none":
            pytest.skip(f"py-spy cannot read this process here: {dump.summary}")
        text = dump.path.read_text() if dump.path else ""
        assert f"Process {proc.pid}: " in text and "--api-key" in text, text
        assert "SECRET" not in text, text
    finally:
        os.killpg(proc.pid, 9)
        proc.wait(10)


@pytest.mark.processes
def test_leftover_processes_are_logged_without_their_secrets():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "--api-key", "SECRET1",
                             "--db=redis://:SECRET2@h/0"], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while "--api-key" not in (shown := leftovers.cmdline_of(proc.pid)) and time.monotonic() < deadline:
            time.sleep(0.01)  # until execve has set the new command line up
        assert shown.endswith(f"--api-key {R} --db=redis://:{R}@h/0"), shown
    finally:
        os.killpg(proc.pid, 9)
        proc.wait(10)


def test_doctor_lists_other_launches_without_secrets_or_control_characters():
    other = LauncherProcess(4242, 1000, ("torchrun", "--master-port", "29511", "train.py", "--hf-token", "SECRET1",
                                         "x.api_key=SECRET2", "\x1b]0;title\x07"), None, True)
    c = DoctorContext.from_values(env={}, uid=1000, master_port=29511, other_launchers=lambda: [other],
                                  nvml=lambda: NvmlView(False, "no driver"),
                                  versions=lambda: Versions(torch="2.7.1", nccl="2.27.3", nvrx="0.4.1", cuda="12.8"))
    report = json.loads(to_json(run_checks(c)))
    [found] = [r for r in report["checks"] if r["id"] == "launcher.per_node"]
    assert found["severity"] == "warn", found
    assert "SECRET" not in found["saw"] and "\x1b" not in found["saw"], found
    assert f"train.py --hf-token {R} x.api_key={R} \\x1b]0;title\\x07" in found["saw"], found
