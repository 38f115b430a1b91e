"""``report.untrusted``, alone: each rule that refuses a planted file (a symlink, a file of another uid, a
mode others can use, a FIFO or a device, a hard link, a size past the bound), under the policies its four
callers use, and each caller's own words for a refusal. Pytest's process alone; playing another user needs
root (chown to 65534)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from mbr_launch.config.errors import ConfigError
from mbr_launch.config.secret import SecretFileError, read_secret
from mbr_launch.config.files import read_yaml
from mbr_launch.report.untrusted import (LINKED, OWNED, REGULAR, SECRET, FilePolicy, FileRule, UnsafeFile,
                                         open_file, read_file)
from mbr_launch.workers import safefile

pytestmark = pytest.mark.timeout(20)
NOBODY = 65534
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="playing another user needs root (chown)")
SECRET_TEXT = b"0123456789abcdef0123456789abcdef"


def _file(tmp_path: Path, data: bytes = b"x: 1\n", mode: int = 0o600, name: str = "f") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    os.chmod(path, mode)
    return path


def _refused(path: Path, policy: FilePolicy, limit: int = 1 << 20) -> UnsafeFile:
    with pytest.raises(UnsafeFile) as caught:
        read_file(path, policy, limit)
    assert caught.value.filename == str(path)
    return caught.value


def test_a_plain_file_of_ours_is_read_under_every_policy(tmp_path):
    path = _file(tmp_path)
    for policy in (REGULAR, LINKED, OWNED, SECRET):
        assert read_file(path, policy, 64) == b"x: 1\n"
        fd = open_file(path, policy)
        os.close(fd)


@pytest.mark.parametrize("policy", [REGULAR, OWNED, SECRET])
def test_a_symlink_is_refused_not_followed(tmp_path, policy):
    link = tmp_path / "link"
    link.symlink_to(_file(tmp_path))
    err = _refused(link, policy)
    assert err.rule is FileRule.KIND and "symlink" in err.strerror
    assert read_file(link, LINKED, 64) == b"x: 1\n"  # the one policy that follows a link the person made


def test_a_symlink_to_dev_zero_is_refused_before_any_read(tmp_path):
    link = tmp_path / "zero"
    link.symlink_to("/dev/zero")
    assert _refused(link, REGULAR).rule is FileRule.KIND
    assert _refused(link, LINKED).rule is FileRule.KIND  # followed: a device, not a regular file


@pytest.mark.parametrize("policy", [REGULAR, LINKED, OWNED, SECRET])
def test_a_fifo_is_refused_without_blocking(tmp_path, policy):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    box: list[BaseException] = []

    def reader() -> None:
        try:
            read_file(fifo, policy, 64)
        except BaseException as exc:  # noqa: BLE001 - the refusal is what we look at
            box.append(exc)

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    thread.join(10)
    if thread.is_alive():  # give the blocked reader its writer, so no thread stays behind
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("reading a FIFO blocked")
    assert isinstance(box[0], UnsafeFile) and box[0].rule is FileRule.KIND, box
    assert "not a regular file" in box[0].strerror


def test_a_directory_is_refused(tmp_path):
    assert _refused(tmp_path, LINKED).rule is FileRule.KIND


@root_only
@pytest.mark.parametrize("policy", [OWNED, SECRET])
def test_a_file_of_another_user_is_refused(tmp_path, policy):
    path = _file(tmp_path)
    os.chown(path, NOBODY, NOBODY)
    err = _refused(path, policy)
    assert err.rule is FileRule.OWNER and f"belongs to uid {NOBODY}" in err.strerror
    assert read_file(path, REGULAR, 64) == b"x: 1\n"  # a policy that does not ask whose it is


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620, 0o602])
def test_a_secret_others_can_read_or_write_is_refused(tmp_path, mode):
    path = _file(tmp_path, mode=mode)
    err = _refused(path, SECRET)
    assert err.rule is FileRule.MODE and f"mode {mode:o}" in err.strerror
    assert read_file(path, OWNED, 64) == b"x: 1\n"


def test_a_hard_link_is_refused_where_the_policy_asks(tmp_path):
    path = _file(tmp_path)
    os.link(path, tmp_path / "second")
    err = _refused(tmp_path / "second", OWNED)
    assert err.rule is FileRule.LINKS and "2 hard links" in err.strerror
    assert read_file(tmp_path / "second", SECRET, 64) == b"x: 1\n"


def test_a_file_over_the_bound_is_refused_and_one_at_it_is_read(tmp_path):
    path = _file(tmp_path, b"a" * 100)
    err = _refused(path, REGULAR, limit=99)
    assert err.rule is FileRule.SIZE and "is 100 bytes, more than the 99 we read" == err.strerror
    assert read_file(path, REGULAR, 100) == b"a" * 100


def test_a_missing_file_is_the_systems_error_not_a_refusal(tmp_path):
    with pytest.raises(FileNotFoundError):
        open_file(tmp_path / "none", OWNED)


# ---- each caller's words ---------------------------------------------------------------------------------


def test_the_agents_words_for_a_refused_dump(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(UnsafeFile, match="is a FIFO, not a regular file"):
        safefile.open_owned(fifo)
    (tmp_path / "link").symlink_to(_file(tmp_path))
    with pytest.raises(UnsafeFile, match="is a symbolic link, not a regular file"):
        safefile.read_owned(tmp_path / "link", 64)
    with pytest.raises(UnsafeFile, match="is 5 bytes, more than the 4 we read"):
        safefile.read_owned(tmp_path / "f", 4)
    with pytest.raises(FileNotFoundError):
        safefile.read_owned(tmp_path / "none", 4)


def test_the_configs_words_for_a_refused_yaml_file(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match=r"^--config: .*fifo is a FIFO \(named pipe\), not a file; give the path"):
        read_yaml(str(fifo))
    link = tmp_path / "link.yaml"
    link.symlink_to(_file(tmp_path))
    assert read_yaml(str(link)) == {"x": 1}  # a config the person linked is followed


@root_only
def test_the_secrets_words_for_a_refused_secret(tmp_path):
    path = _file(tmp_path, SECRET_TEXT)
    assert read_secret(str(path)) == SECRET_TEXT
    os.chmod(path, 0o644)
    with pytest.raises(SecretFileError, match=f"mode 644\\); run: chmod 600 {path}$"):
        read_secret(str(path))
    os.chmod(path, 0o600)
    os.chown(path, NOBODY, NOBODY)
    with pytest.raises(SecretFileError, match=f"belongs to uid {NOBODY}, not to this user"):
        read_secret(str(path))
    (tmp_path / "link").symlink_to(path)
    with pytest.raises(SecretFileError, match=r"cannot open .*link: is a symlink \(not followed\) \(a symbolic"):
        read_secret(str(tmp_path / "link"))
