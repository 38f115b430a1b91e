"""A 64 KiB tmpfs to fill up (root mounts it; tests that need it are skipped otherwise)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

PAGE = 4096


@pytest.fixture
def tiny_disk(tmp_path):
    """A 64 KiB tmpfs (16 pages), unmounted afterwards."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(disk: Path, leave_pages: int = 0) -> None:
    """Take all of ``disk`` but ``leave_pages`` pages."""
    st = os.statvfs(disk)
    free = st.f_bavail * st.f_frsize
    (disk / "filler").write_bytes(b"\0" * (free - leave_pages * PAGE))


def whole_lines(path: Path) -> list[dict]:
    data = path.read_bytes()
    assert not data or data.endswith(b"\n"), f"{path} ends in half a line: {data[-80:]!r}"
    return [json.loads(line) for line in data.splitlines()]
