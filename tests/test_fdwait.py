"""Descriptor numbers from 1024 up: ``fdwait.ready`` against real pipes, and a real launch whose agent holds
that many descriptors (as the store host of 256 agents does), through a crash, a restart from standbys and a
clean end. ``select(2)`` refuses such numbers ("filedescriptor out of range in select()"): the store host of
256 agents ended with exit 4 in its restart round."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time

import pytest

from mbr_launch.fdwait import ready
from testkit.helpers import LAUNCHER, REPO, launcher_env

pytestmark = pytest.mark.timeout(120)
HIGH = 1100  # descriptors taken before the launcher opens its own: every one it opens is numbered above


@pytest.fixture
def room():
    """A soft descriptor limit with room above HIGH (restored after)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < HIGH + 512:
        pytest.skip(f"the hard descriptor limit ({hard}) leaves no room above {HIGH}")
    want = HIGH + 4096 if hard == resource.RLIM_INFINITY else min(hard, HIGH + 4096)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, want), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_ready_reads_writes_hangups_and_timeouts_above_1024(room):
    r, w = os.pipe()
    high_r, high_w = os.dup2(r, HIGH + 1), os.dup2(w, HIGH + 2)
    os.close(r)
    os.close(w)
    try:
        start = time.monotonic()
        assert ready([high_r], 0.2) == [] and time.monotonic() - start >= 0.19  # nothing to read: the timeout
        assert ready([high_w], 0, write=True) == [high_w]
        os.write(high_w, b"x")
        assert ready([high_r], None) == [high_r]
        os.read(high_r, 1)
        os.close(high_w)
        assert ready([high_r], 1.0) == [high_r]  # the writer is gone: readable (EOF), as select says
        assert ready([], 0.01) == []
    finally:
        os.close(high_r)


# Rank 1 fails once; the restarted ranks run to the end. The script imports only the standard library, so the
# standbys that take the restart are at the interpreter level (no torch): the test is about descriptors.
SCRIPT = """\
import os, sys, time
if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    time.sleep(1.0 if os.environ["RANK"] == "1" else 60)  # rank 0 is stopped by the restart
    sys.exit(3)
time.sleep(0.5)
# One write: under `python -u` a print of several arguments is several writes, and when the other rank's line
# comes between two of them the console ends the unfinished one (two ranks never share a line).
print(f"rank {os.environ['RANK']} done in round {os.environ['TORCHELASTIC_RESTART_COUNT']}", flush=True)
"""
# Takes descriptors 3..HIGH (inherited across exec), then becomes the launcher.
CROWD = ("import os, sys\n"
         "fd = os.open(os.devnull, os.O_RDONLY)\n"
         f"for n in range(fd + 1, {HIGH}):\n"
         "    os.dup2(fd, n, inheritable=True)\n"
         "os.execv(sys.argv[1], sys.argv[1:])\n")


@pytest.mark.processes
def test_a_launch_whose_agent_holds_over_1024_descriptors_restarts_and_ends_cleanly(room, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    logs = tmp_path / "logs"
    done = subprocess.run([sys.executable, "-c", CROWD, *LAUNCHER, "--standalone", "--nproc-per-node", "2",
                           "--max-restarts", "1", "--log-dir", str(logs), "--skip-check", "all", str(script)],
                          capture_output=True, text=True, timeout=100, cwd=REPO, env=launcher_env())
    assert done.returncode == 0, done.stderr[-3000:]
    assert "out of range" not in done.stderr, done.stderr[-3000:]
    assert sorted(line for line in done.stdout.splitlines() if "done in round" in line) == \
        ["[rank0]:rank 0 done in round 1", "[rank1]:rank 1 done in round 1"], done.stdout
    events = [json.loads(line) for f in logs.rglob("events.jsonl") for line in f.read_text().splitlines()]
    restarted = [e for e in events if e["event"] == "worker_start" and e.get("restart_count") == 1]
    assert len(restarted) == 2, restarted
    # the standbys, whose channel is numbered above 1024 in their own process too, took the restart
    assert all(e["standby"] is True for e in restarted), restarted
