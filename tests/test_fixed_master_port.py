"""An explicit --master-addr/--master-port is the workers' MASTER_ADDR:MASTER_PORT, as under torchrun, and a
``tcp://`` or ``env://`` init at it works, restarts included (issue #38, ``cluster.workerstore``).

Older scripts build their init method from the address and port they gave the launcher. On torch 2.14 such an
init with another MASTER_PORT makes rank 0 listen on the port the agent's static store holds (EADDRINUSE).
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from torch.distributed import PrefixStore, TCPStore

from mbr_launch.cluster import workerstore

from testkit.helpers import SCRIPTS, finish, free_port, launcher_env, run_events, run_launcher

SCRIPT = str(SCRIPTS / "fixed_port_init.py")
ENVDUMP = str(SCRIPTS / "envdump.py")
OURS = [sys.executable, "-m", "mbr_launch"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
PG_TIMEOUT = "120"  # seconds a rank's init may wait for the other: the failure mode is a wait, bounded here


def _run(launcher: list[str], args: list[str], *, timeout: float = 240) -> subprocess.CompletedProcess:
    env = launcher_env()
    env.pop("PET_MASTER_PORT")  # the command line gives the port
    return run_launcher(args, timeout=timeout, env=env, launcher=launcher)


def _fixed(port: int, extra: list[str], out: Path, how: str, fail: bool) -> list[str]:
    return ["--master-addr=localhost", f"--master-port={port}", "--nnodes=1", "--nproc-per-node=2", *extra,
            SCRIPT, str(out), how, "localhost", str(port), "fail" if fail else "ok", PG_TIMEOUT]


def _results(out: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))}


def _expect(results: dict[str, dict], attempts: int, port: int) -> None:
    assert sorted(results) == sorted(f"rank{r}.attempt{a}" for r in (0, 1) for a in range(attempts)), results
    for name, got in results.items():
        assert got["sum"] == 3.0, (name, got)  # 1 + 2: both ranks took part in the all_reduce
        assert got["env"] == {"MASTER_ADDR": "localhost", "MASTER_PORT": str(port),
                              "TORCHELASTIC_USE_AGENT_STORE": "True"}, (name, got)
        assert got["stale"] is False, (name, got)  # attempt 0's keys were cleared before attempt 1 began


@pytest.mark.processes
@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", ["tcp", "env"])
def test_restart_inits_again_at_the_given_port(tmp_path, how):
    """Rank 1 fails after attempt 0's all_reduce; attempt 1 inits at the same port, in a store cleared of
    attempt 0's worker keys, and succeeds."""
    port, out = free_port(), tmp_path / "out"
    out.mkdir()
    logs = tmp_path / "logs"
    proc = _run(OURS, _fixed(port, ["--max-restarts=1", "--log-dir", str(logs)], out, how, fail=True))
    assert proc.returncode == 0, proc.stderr[-4000:]
    _expect(_results(out), 2, port)
    rounds = [e for e in run_events(logs) if e["event"] == "rendezvous"]
    assert [(e["round"], e["master_port"], e["master_addr"]) for e in rounds] == \
        [(0, port, "localhost"), (1, port, "localhost")]


@pytest.mark.processes
@pytest.mark.timeout(300)
def test_two_static_nodes_restart_at_the_given_port(tmp_path):
    """Two agents of a static rendezvous, one rank each: rank 1 (node 1) fails once; node 0's agent clears the
    store only once both nodes stopped their workers, and both attempts init at the given port."""
    port, out = free_port(), tmp_path / "out"
    out.mkdir()
    env = launcher_env()
    env.pop("PET_MASTER_PORT")
    procs = [subprocess.Popen([*OURS, "--master-addr=localhost", f"--master-port={port}", "--nnodes=2",
                               f"--node-rank={node}", "--nproc-per-node=1", "--max-restarts=1", "--log-dir",
                               str(tmp_path / f"logs{node}"), SCRIPT, str(out), "tcp", "localhost", str(port), "fail",
                               PG_TIMEOUT], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                              start_new_session=True) for node in (0, 1)]
    try:
        results = [finish(p, 240) for p in procs]
    finally:
        for proc in procs:  # the other agent, when one timed out
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
    for proc, (_out, err) in zip(procs, results):
        assert proc.returncode == 0, err[-4000:]
    _expect(_results(out), 2, port)


@pytest.mark.processes
@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", ["tcp", "env"])
def test_same_outcome_as_torchrun(tmp_path, how):
    """The fault-free command line under both launchers: exit 0, the same files, the same store seen.
    (torchrun's restart of it is a race: its store keeps attempt 0's gloo addresses, ``cluster.workerstore``.)"""
    port = free_port()
    for name, launcher in (("torchrun", TORCHRUN), ("ours", OURS)):
        out = tmp_path / name
        out.mkdir()
        proc = _run(launcher, _fixed(port, [], out, how, fail=False))
        assert proc.returncode == 0, (name, proc.stderr[-4000:])
        _expect(_results(out), 1, port)


@pytest.mark.processes
@pytest.mark.timeout(300)
def test_static_worker_env_matches_torchrun(tmp_path):
    """Every variable torchrun sets for a static rendezvous's workers, with the same value where it is not a
    path of the run; ours adds only our fault-tolerance plumbing and the Flight Recorder's settings."""
    port = free_port()
    dumps: dict[str, dict[int, dict[str, str]]] = {}
    parent = launcher_env()
    parent.pop("PET_MASTER_PORT")
    for name, launcher in (("torchrun", TORCHRUN), ("ours", OURS)):
        out = tmp_path / name
        out.mkdir()
        proc = _run(launcher, ["--master-addr=localhost", f"--master-port={port}", "--nnodes=1",
                               "--nproc-per-node=2", ENVDUMP, str(out)])
        assert proc.returncode == 0, (name, proc.stderr[-4000:])
        dumps[name] = {int(p.stem): json.loads(p.read_text()) for p in out.glob("*.json")}
    from mbr_launch.workers.flightrec import TORCH_ENV

    path_valued = {"TORCHELASTIC_ERROR_FILE"}
    for rank in (0, 1):
        theirs, ours = dumps["torchrun"][rank], dumps["ours"][rank]
        t_added = {k for k in theirs if theirs[k] != parent.get(k)}
        o_added = {k for k in ours if ours[k] != parent.get(k)}
        assert t_added <= o_added, f"torchrun sets {t_added - o_added}, we do not"
        extras = {k for k in o_added - t_added if not k.startswith(("MBR_", "FT_")) and k not in TORCH_ENV}
        assert not extras, f"rank {rank}: unexpected extras {extras}"
        differ = {k for k in t_added - path_valued if theirs[k] != ours[k]}
        assert not differ, {k: (theirs[k], ours[k]) for k in differ}


def test_clearing_keeps_the_agents_keys_only():
    """Between rounds the static store loses every key the workers wrote (a real TCPStore, no process)."""
    timeout = datetime.timedelta(seconds=10)
    server = TCPStore("127.0.0.1", 0, is_master=True, multi_tenant=True, wait_for_workers=False, timeout=timeout)
    worker = TCPStore("127.0.0.1", server.port, is_master=False, timeout=timeout)
    PrefixStore("job7", server).set("mbr/attempt0/mbr/layout", "x")  # torch's static handler's prefix
    PrefixStore("mbr/job/job7", server).add("restarts", 1)
    server.set("torch.rendezvous.job7", "state")
    PrefixStore("default_pg", worker).set("0//cpu//0/1", "a dead rank's address")
    worker.set("my_barrier", "1")
    worker.add("job7", 1)  # a worker key that only looks like the run id: no "/" after it
    port = workerstore.round_port(server, "job7")
    assert port == server.port
    assert sorted(server.list_keys()) == ["job7/mbr/attempt0/mbr/layout", "mbr/job/job7/restarts",
                                          "torch.rendezvous.job7"]


def test_a_store_that_cannot_list_its_keys_is_named():
    class Unlisted:  # a torch before Store.list_keys
        port = 1

    with pytest.raises(workerstore.NotClearable, match="--rdzv-backend c10d"):
        workerstore.round_port(Unlisted(), "job")


def test_static_addr_is_the_endpoint_host_as_given():
    assert workerstore.static_addr("localhost:1234") == "localhost"
    assert workerstore.static_addr("node-0.cluster:29500") == "node-0.cluster"
