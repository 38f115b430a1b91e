"""A node cut off from the network, for real: agents in network namespaces, a link taken down."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from . import netns
from .helpers import SCRIPTS, finish, launcher_env

SLEEPER = str(SCRIPTS / "sleeper.py")
pytestmark = [pytest.mark.timeout(150), pytest.mark.netns]

why = netns.available()
if why:
    pytest.skip(why, allow_module_level=True)


@pytest.fixture
def hosts():
    h = netns.Hosts(3)
    yield h
    h.close()
    assert not h.leftovers(), h.leftovers()


def _start(hosts: netns.Hosts, nnodes: str, ready: Path, extra: list[str]) -> list[subprocess.Popen]:
    port = 29631
    procs = []
    for i in range(hosts.count):
        conf = "is_host=1" if i == 0 else "is_host=0"
        argv = [sys.executable, "-m", "mbr_launch", "--skip-check", "all", "--nnodes", nnodes, "--nproc-per-node",
                "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{hosts.ips[0]}:{port}", "--rdzv-id", "cut",
                "--rdzv-conf", f"{conf},last_call_timeout=1", "--local-addr", hosts.ips[i], "--peer-timeout", "2",
                "--max-restarts", "2", *extra, SLEEPER, "--ready-file", str(ready), "--run-seconds", "60"]
        procs.append(subprocess.Popen(hosts.command(i, argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, env=launcher_env(), start_new_session=True))
        time.sleep(0.3)
    return procs


def _wait_lines(path: Path, count: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and len(path.read_text().splitlines()) >= count:
            return
        time.sleep(0.2)
    raise AssertionError(f"{path} never reached {count} lines")


def test_cut_node_ends_a_fixed_size_job_everywhere(tmp_path, hosts):
    ready = tmp_path / "ready"
    procs = _start(hosts, "3", ready, [])
    _wait_lines(ready, 3, 60)
    t_cut = time.monotonic()
    hosts.cut(2)
    outs = [finish(p, 60) for p in procs]
    elapsed = time.monotonic() - t_cut
    codes = [p.returncode for p in procs]
    # survivors: the lost node is noticed, fewer than --nnodes remain -> the job ends (exit 1), no NCCL wait
    assert codes[0] == 1 and codes[1] == 1, outs[:2]
    assert "only 2 node(s) remain" in outs[0][1] + outs[1][1]
    # the cut node: it lost the rendezvous store -> exit 3 with a clear message
    assert codes[2] == 3, outs[2][1]
    assert "LOST THE RENDEZVOUS STORE" in outs[2][1]
    assert elapsed < 30, f"took {elapsed:.1f} s"


def test_cut_node_elastic_job_goes_on(tmp_path, hosts):
    ready = tmp_path / "ready"
    procs = _start(hosts, "2:3", ready, [])
    _wait_lines(ready, 3, 60)
    t_cut = time.time()
    hosts.cut(2)
    cut_out = finish(procs[2], 60)
    assert procs[2].returncode == 3, cut_out[1]
    # the two survivors restart on their own
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        restarted = [float(t) for r, n, _p, t in (l.split() for l in ready.read_text().splitlines()) if n == "1"]
        if len(restarted) >= 2:
            break
        time.sleep(0.2)
    assert len(restarted) == 2, ready.read_text()
    assert max(restarted) - t_cut < 30
    for p in procs[:2]:
        p.terminate()
    outs = [finish(p, 60) for p in procs[:2]]
    assert any("silent" in err for _o, err in outs), outs
