"""Several agents on this machine through a real c10d rendezvous; and env parity with torchrun."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from testkit.eventlog import read_events
from mbr_launch.workers.flightrec import TORCH_ENV

from testkit.helpers import SCRIPTS, finish, free_port, launcher_env

TRAIN = str(SCRIPTS / "train.py")
ENVDUMP = str(SCRIPTS / "envdump.py")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
pytestmark = [pytest.mark.timeout(180), pytest.mark.processes]

# What torchrun sets that we set identically (values compared), and what differs on purpose.
SAME_VALUE = ("TORCHELASTIC_SIGNALS_TO_HANDLE", "RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "LOCAL_WORLD_SIZE", "WORLD_SIZE",
              "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
              "TORCH_NCCL_ASYNC_ERROR_HANDLING", "OMP_NUM_THREADS")
OURS_ONLY_PREFIXES = ("MBR_", "FT_")  # our fault-tolerance plumbing; nothing else may differ
# Flight Recorder, which the hang verdict reads (issue #14), is set unless the user set it: flightrec.TORCH_ENV


def _agents(n: int, port: int, extra: list[str], script_args: list[str], *, launcher=None, nproc: int = 1):
    launcher = launcher or [sys.executable, "-m", "mbr_launch"]
    procs = []
    for _ in range(n):
        cmd = [*launcher, "--nnodes", str(n), "--nproc-per-node", str(nproc), "--rdzv-backend", "c10d",
               "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"job{port}", *extra, *script_args]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      env=launcher_env(), start_new_session=True))
    return [(p, *finish(p, 150)) for p in procs]


def _ready(path: Path) -> list[tuple[int, int]]:
    return sorted((int(r), int(n)) for r, n, _ in (line.split() for line in path.read_text().splitlines()))


def test_three_agents_restart_together(tmp_path):
    ready = tmp_path / "ready"
    results = _agents(3, free_port(), ["--max-restarts", "2", "--log-dir", str(tmp_path / "logs")],
                      [TRAIN, "--expect-world", "3", "--crash-rank", "2", "--ready-file", str(ready)])
    for proc, _out, err in results:
        assert proc.returncode == 0, err
    assert _ready(ready) == [(r, n) for r in range(3) for n in range(2)]
    # every agent saw the same job-wide restart count
    assert sum("restart 1 of 2" in err for _p, _o, err in results) == 3
    # Every agent alive and nobody waiting: the restart round was agreed on the fast path, the same for all
    # (one master port, one restart count), each agent keeping its group rank; the first round was c10d's.
    rounds = [e for p in (tmp_path / "logs").glob("*/events.jsonl") for e in read_events(p) if e["event"] == "rendezvous"]
    first, second = ([e for e in rounds if e["round"] == n] for n in (0, 1))
    assert len(first) == len(second) == 3 and not any(e["fast"] for e in first), rounds
    assert all(e["fast"] and "fallback" not in e for e in second), second
    assert len({(e["master_port"], e["restart_count"], e["world_size"]) for e in second}) == 1, second
    assert {e["master_port"] for e in second} != {e["master_port"] for e in first}
    assert sorted(e["group_rank"] for e in second) == [0, 1, 2]


def _dumps(directory: Path) -> dict[int, dict[str, str]]:
    return {int(p.stem): json.loads(p.read_text()) for p in directory.glob("*.json")}


def _compare(theirs: dict[int, dict], ours: dict[int, dict], parent: dict[str, str]) -> None:
    assert sorted(theirs) == sorted(ours)
    for rank in theirs:
        t_added = {k for k in theirs[rank] if theirs[rank].get(k) != parent.get(k)}
        o_added = {k for k in ours[rank] if ours[rank].get(k) != parent.get(k)}
        assert t_added - o_added == set(), f"rank {rank}: torchrun sets {t_added - o_added}, we do not"
        extras = {k for k in o_added - t_added if not k.startswith(OURS_ONLY_PREFIXES) and k not in TORCH_ENV}
        assert not extras, f"rank {rank}: unexpected extras {extras}"
        assert {"FT_RANK_MONITOR_IPC_SOCKET", "FT_LAUNCHER_IPC_SOCKET"} <= o_added
        for key in SAME_VALUE:
            assert theirs[rank].get(key) == ours[rank].get(key), (rank, key)
        assert theirs[rank]["TORCHELASTIC_USE_AGENT_STORE"] == "True"  # torchrun shares its store ...
        assert ours[rank]["TORCHELASTIC_USE_AGENT_STORE"] == "True"  # ... ours serves a fresh one each round
        assert ours[rank]["TORCHELASTIC_ERROR_FILE"].endswith("error.json")
        assert ours[rank]["MASTER_ADDR"] and int(ours[rank]["MASTER_PORT"]) > 0


def test_env_parity_single_node(tmp_path):
    parent = launcher_env()
    dumps = {}
    for name, launcher in (("torchrun", TORCHRUN), ("ours", [sys.executable, "-m", "mbr_launch"])):
        out = tmp_path / name
        out.mkdir()
        proc = subprocess.run([*launcher, "--standalone", "--nproc-per-node", "2", ENVDUMP, str(out)],
                              env=parent, capture_output=True, text=True, timeout=90)
        assert proc.returncode == 0, proc.stderr
        dumps[name] = _dumps(out)
    _compare(dumps["torchrun"], dumps["ours"], parent)
    for rank in (0, 1):
        assert dumps["ours"][rank]["MASTER_ADDR"] == dumps["torchrun"][rank]["MASTER_ADDR"]


def test_env_parity_two_nodes(tmp_path):
    parent = launcher_env()
    dumps = {}
    for name, launcher in (("torchrun", TORCHRUN), ("ours", [sys.executable, "-m", "mbr_launch"])):
        out = tmp_path / name
        out.mkdir()
        results = _agents(2, free_port(), [], [ENVDUMP, str(out)], launcher=launcher)
        for proc, _o, err in results:
            assert proc.returncode == 0, err
        dumps[name] = _dumps(out)
    _compare(dumps["torchrun"], dumps["ours"], parent)
