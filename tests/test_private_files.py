"""The pieces that keep logs private, alone (issue 16, findings 2 and 4): the base folder's checks, files
never opened through a symlink, run ids made into one path component, secrets redacted from argv. The real
launches are in test_private_logs.py. Playing another user needs root (chown to 65534).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from mbr_launch.config.errors import ConfigError
from mbr_launch.config.rundir import checked_log_dir, make_run_dir, private_base, safe_component
from mbr_launch.config.slurm import SlurmEnv
from mbr_launch.report.appender import LineAppender
from mbr_launch.report.private import make_dir, open_private
from mbr_launch.report.redact import REDACTED, redact_argv

pytestmark = pytest.mark.timeout(10)
NOBODY = 65534
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="playing another user needs root (chown)")


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


# ---- the base folder -------------------------------------------------------------------------------------


@root_only
def test_base_of_another_user_is_refused(tmp_path):
    base = tmp_path / "mbr-launch-0"
    base.mkdir(mode=0o700)
    os.chown(base, NOBODY, NOBODY)
    with pytest.raises(ConfigError, match=f"belongs to uid {NOBODY}, not to you"):
        private_base(base)


def test_base_that_is_a_symlink_is_refused(tmp_path):
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    (tmp_path / "base").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ConfigError, match="is a symlink"):
        private_base(tmp_path / "base")


def test_base_writable_by_others_is_refused_and_a_readable_one_closed(tmp_path):
    base = tmp_path / "base"
    base.mkdir()
    os.chmod(base, 0o775)
    with pytest.raises(ConfigError, match="writable by others"):
        private_base(base)
    os.chmod(base, 0o755)
    assert private_base(base) == base and _mode(base) == 0o700
    fresh = tmp_path / "fresh"
    private_base(fresh)
    assert _mode(fresh) == 0o700


def test_log_dir_anyone_may_write_needs_the_sticky_bit(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with pytest.raises(ConfigError, match="without the sticky bit"):
        checked_log_dir(shared)
    os.chmod(shared, 0o1777)
    assert checked_log_dir(shared) == shared


# ---- files: never through a symlink, never someone else's ------------------------------------------------


def test_a_planted_symlink_is_never_followed(tmp_path):
    target = tmp_path / "victim_file"
    target.write_text("precious\n")
    (tmp_path / "stdout.log").symlink_to(target)
    log = LineAppender(tmp_path / "stdout.log")
    assert not log.append(b"worker output\n") and log.error.errno == errno.ELOOP
    (tmp_path / "events.jsonl").symlink_to(target)
    assert LineAppender(tmp_path / "events.jsonl", fresh=True).error.errno == errno.EEXIST  # O_EXCL
    (tmp_path / "hard.log").hardlink_to(target)
    with pytest.raises(OSError, match="not a regular file of ours"):
        open_private(tmp_path / "hard.log")
    (tmp_path / "attempt_1").symlink_to(tmp_path)
    with pytest.raises(OSError, match="is a symlink"):
        make_dir(tmp_path / "attempt_1")
    assert target.read_text() == "precious\n"


def test_run_ids_become_one_harmless_path_component(tmp_path):
    for raw in ("../../escape", "..", ".hidden", "a/b", "x\0y", "é", "", "j" * 300):
        name = safe_component(raw)
        assert name and "/" not in name and "\0" not in name and not name.startswith(".") and len(name) <= 80
    assert safe_component("slurm-1234-0-r0") == "slurm-1234-0-r0"  # ordinary ids are kept as they are
    slurm = SlurmEnv.from_environ({"SLURM_JOB_ID": "../../../etc/x", "SLURM_JOB_NODELIST": "n1"})
    logs = tmp_path / "logs"
    run_dir = make_run_dir(str(logs), slurm.run_id(), "../node")
    assert run_dir.parent == logs and _mode(run_dir) == 0o700



def test_redact_argv_both_spellings():
    argv = ["mbr-launch", "--nproc-per-node", "2", "train.py", "--api-key", "K1", "--hf_token=T1", "--lr", "0.1",
            "-password", "P1", "--client-secret", "--", "--use-token-cache", "--verbose", "--SECRET=S1", "--key"]
    out = redact_argv(argv)
    assert out == ["mbr-launch", "--nproc-per-node", "2", "train.py", "--api-key", REDACTED, f"--hf_token={REDACTED}",
                   "--lr", "0.1", "-password", REDACTED, "--client-secret", "--", "--use-token-cache", "--verbose",
                   f"--SECRET={REDACTED}", "--key"]
