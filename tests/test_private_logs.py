"""Logs another user can neither read nor redirect, with no secret in them, and run ids that stay inside
``--log-dir`` (issue 16, findings 2 and 4), with real launches.

The attack of the issue runs for real: the test (root) plays the other user by handing folders to uid 65534
and planting a symlink where the victim's next attempt writes; a real launcher runs beside it. The pieces
alone are in test_private_files.py.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from testkit.eventlog import read_events

from testkit.helpers import finish, launcher_env, run_launcher, start_launcher

pytestmark = [pytest.mark.timeout(90), pytest.mark.processes]
NOBODY = 65534
REDACTED = "<redacted>"
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="playing another user needs root (chown)")


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_rdzv_id_cannot_escape_the_log_dir(tmp_path, port):
    """torchrun takes any string as a rendezvous id: the run keeps it, the folder name is cleaned."""
    logs = tmp_path / "a" / "logs"
    script = tmp_path / "show.py"
    script.write_text("import os\nprint('RUN_ID=' + os.environ['TORCHELASTIC_RUN_ID'])\n")
    res = run_launcher(["--nnodes", "1", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                        f"127.0.0.1:{port}", "--rdzv-id", "../../escape", "--skip-check", "all", "--log-dir",
                        str(logs), str(script)], timeout=60)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "[rank0]:RUN_ID=../../escape" in res.stdout
    assert not [p for p in tmp_path.rglob("*escape*") if logs not in p.parents], "a run folder escaped"
    runs = [p for p in logs.iterdir() if p.is_dir()]
    assert len(runs) == 1 and (runs[0] / "events.jsonl").exists(), list(tmp_path.rglob("*"))
    assert read_events(runs[0] / "events.jsonl")[0]["run_id"] == "../../escape"


def test_default_logs_are_private_and_hold_no_secret(tmp_path):
    """No --log-dir: <tmp>/mbr-launch-<uid>, 0700 all the way down, files 0600; secrets in the script's
    arguments are redacted in events.jsonl, and the environment is written nowhere."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    script = tmp_path / "hello.py"
    script.write_text("import sys\nprint('hello')\nprint('to stderr', file=sys.stderr)\n")
    env = launcher_env(TMPDIR=str(tmp), MY_SERVICE_TOKEN="ENV-SECRET-4242")
    res = run_launcher(["--standalone", "--nproc-per-node", "1", "--tee", "3", "--skip-check", "all", str(script),
                        "--api-key", "ARG-SECRET-1", "--hf_token=ARG-SECRET-2", "--db-password", "ARG-SECRET-3"],
                       env=env, timeout=60)
    assert res.returncode == 0, res.stderr[-2000:]
    files = [p for p in tmp.rglob("*") if p.is_file() and not p.is_symlink()]
    assert {p.name for p in files} >= {"events.jsonl", "stdout.log", "stderr.log"}, files
    for path in files:
        data = path.read_bytes()
        for secret in (b"ARG-SECRET-1", b"ARG-SECRET-2", b"ARG-SECRET-3", b"ENV-SECRET-4242"):
            assert secret not in data, f"{secret!r} written to {path}"
    base = tmp / f"mbr-launch-{os.geteuid()}"
    assert base.is_dir() and _mode(base) == 0o700, list(tmp.iterdir())
    for path in base.rglob("*"):
        if path.is_symlink():  # `latest`, a link to the run folder in the base (a link's own mode means nothing)
            assert path.name == "latest" and (base / os.readlink(path)).parent == base, path
        elif path.is_dir():
            assert _mode(path) == 0o700, path
        elif path.name.endswith((".log", ".jsonl", ".txt")):
            assert _mode(path) == 0o600, path
    start = read_events(next(base.glob("*/events.jsonl")))[0]
    assert start["argv"][-5:] == ["--api-key", REDACTED, f"--hf_token={REDACTED}", "--db-password", REDACTED]


# ---- the attack of the issue -----------------------------------------------------------------------------


@root_only
def test_planted_base_cannot_redirect_worker_output(tmp_path):
    """Another user creates the shared base first. Once the victim's run folder appears, they swap it for
    one of their own holding ``attempt_1/0/stdout.log`` -> a file of their choice, and wait for the
    restart. The launcher must refuse the base (exit 2, one line) and write nothing through it."""
    tmp = tmp_path / "tmp"
    tmp.mkdir(mode=0o1777)
    os.chmod(tmp, 0o1777)
    target = tmp_path / "attackers_choice"
    target.write_text("")
    bases = [tmp / "mbr-launch", tmp / f"mbr-launch-{os.geteuid()}"]  # the old name and the new one
    for base in bases:
        base.mkdir()
        os.chmod(base, 0o777)
        os.chown(base, NOBODY, NOBODY)
    go = tmp_path / "swapped"
    script = tmp_path / "victim.py"
    script.write_text(
        "import os, sys, time\n"
        "if os.environ['TORCHELASTIC_RESTART_COUNT'] == '0':\n"
        "    deadline = time.time() + 15\n"
        f"    while not os.path.exists({str(go)!r}) and time.time() < deadline:\n"
        "        time.sleep(0.05)\n"
        "    sys.exit(1)\n"
        "print('VICTIM-SECRET-OUTPUT', flush=True)\n")
    proc = start_launcher(["--standalone", "--nproc-per-node", "1", "--max-restarts", "1", "--redirects", "3",
                           "--skip-check", "all", str(script)], env=launcher_env(TMPDIR=str(tmp)))
    try:
        run_dir = _wait_for_run_dir(bases, proc)
        if run_dir is not None:  # the launcher accepted the planted base: play the attack through
            os.rename(run_dir, run_dir.with_name(run_dir.name + ".moved"))
            (run_dir / "attempt_1" / "0").mkdir(parents=True)
            (run_dir / "attempt_1" / "0" / "stdout.log").symlink_to(target)
        go.touch()
    finally:
        out, err = finish(proc, timeout=60)
    assert "VICTIM-SECRET-OUTPUT" not in target.read_text(), "worker output went to the attacker's file"
    assert proc.returncode == 2, err[-2000:]
    lines = [line for line in err.splitlines() if line.startswith("mbr-launch: error:")]
    assert len(lines) == 1 and f"belongs to uid {NOBODY}" in lines[0] and "Traceback" not in err, err
    assert not [p for base in bases for p in base.iterdir()], "something was written into the planted base"


def _wait_for_run_dir(bases: list[Path], proc, timeout: float = 30.0) -> Path | None:
    """The victim's run folder in one of ``bases`` once it exists; None when the launcher ended first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        for base in bases:
            found = [p for p in base.iterdir() if p.is_dir()]
            if found:
                return found[0]
        time.sleep(0.05)
    return None
