"""A long ``TMPDIR`` and the rank monitor's Unix sockets (issue 16, finding 7).

A socket path holds at most 107 bytes. With a 95-character TMPDIR the launcher used to wait 30 s and then
say "rank monitor did not answer 'ready'", although the monitor had said why at once. Now the sockets go
where they fit, and a monitor that refuses a command is heard at once, with its reason.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from mbr_launch.monitor.link import MonitorError, MonitorLink

from testkit.helpers import launcher_env, run_launcher

pytestmark = [pytest.mark.timeout(60), pytest.mark.processes]


def _long_dir(tmp_path: Path, length: int) -> Path:
    """A fresh private folder whose path has exactly ``length`` characters."""
    room = length - len(str(tmp_path)) - 1
    assert room > 0, tmp_path
    path = tmp_path / ("d" * room)
    path.mkdir(mode=0o700)
    assert len(str(path)) == length
    return path


def test_launch_with_a_95_character_tmpdir(tmp_path):
    """Each rank reaches the monitor: its socket path fits although TMPDIR is long. (A plain connect: the
    NVRx client's protocol is tested elsewhere, and importing it costs seconds here.)"""
    tmp = _long_dir(tmp_path, 95)
    script = tmp_path / "client.py"
    script.write_text("import os, socket\npath = os.environ['FT_RANK_MONITOR_IPC_SOCKET']\nprint('SOCKET=' + path)\n"
                      "with socket.socket(socket.AF_UNIX) as s:\n    s.connect(path)\n"
                      "print('CONNECTED', flush=True)\n")
    started = time.monotonic()
    res = run_launcher(["--standalone", "--nproc-per-node", "1", "--skip-check", "all", "--log-dir",
                        str(tmp_path / "logs"), str(script)], env=launcher_env(TMPDIR=str(tmp)), timeout=45)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "[rank0]:CONNECTED" in res.stdout, res.stdout
    socket_path = next(line for line in res.stdout.splitlines() if "SOCKET=" in line).split("SOCKET=", 1)[1]
    assert len(os.fsencode(socket_path)) <= 107, socket_path
    assert time.monotonic() - started < 30, "the launcher waited for the monitor"


def test_a_monitor_that_cannot_listen_says_why_at_once(tmp_path):
    """Its socket folder is private, but too long for a socket path: the monitor's own reason, at once."""
    sock_dir = _long_dir(tmp_path, 100)
    link = MonitorLink(lambda event: None, env=launcher_env())
    started = time.monotonic()
    try:
        with pytest.raises(MonitorError, match="too long") as caught:
            link.start(sock_dir, {}, timeout=20)
    finally:
        link.close(timeout=5)
    assert "refused 'configure'" in str(caught.value)
    assert time.monotonic() - started < 10
