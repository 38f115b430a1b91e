"""The command lines NeMo-Run writes for ft_launcher (Megatron-Bridge's FaultTolerancePlugin launches through it)
run unchanged with ``ft_launcher`` replaced by ``mbr-launch``, with the NVRx 0.6.0 client Megatron-Bridge pins.

nemo-run 0.11.1 (``nemo_run/run/torchx_backend/components/ft_launcher.py`` over its ``torchrun`` component) writes,
for one node of two GPUs:
- with no fault-tolerance parameter: ``--ignore-missing-fault-tol-cfg`` and torchrun's flags;
- with them: ``--ft-workload_check_interval``, ``--ft-initial_rank_heartbeat_timeout``,
  ``--ft-rank_heartbeat_timeout``, ``--ft-rank_termination_signal``, ``--ft-log_level`` (each only when set) and
  ``--max-restarts``, then torchrun's flags;
torchrun's flags being ``--rdzv-backend c10d --rdzv-endpoint localhost:0 --rdzv-id ID --nnodes 1 --nproc-per-node 2
--node-rank 0 --tee 3`` (port 0: c10d binds a free port).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from testkit.eventlog import read_events

from testkit.helpers import SCRIPTS, launcher_env, run_launcher
from testkit.nvrx_versions import nvrx_env

pytestmark = [pytest.mark.timeout(150), pytest.mark.processes]

TRAIN = str(SCRIPTS / "nvrx_heartbeat_train.py")


def torchrun_part(rdzv_id: str) -> list[str]:
    return ["--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0", "--rdzv-id", rdzv_id, "--nnodes", "1",
            "--nproc-per-node", "2", "--node-rank", "0", "--tee", "3"]


def _launch(args: list[str], log_dir: Path) -> tuple[object, list[dict]]:
    env = nvrx_env("0.6.0", launcher_env(MBR_LOG_DIR=str(log_dir)))
    res = run_launcher(args, env=env, timeout=130)
    return res, read_events(next(log_dir.glob("*/events.jsonl")))


def test_the_bare_single_node_line(tmp_path):
    res, events = _launch(["--ignore-missing-fault-tol-cfg", *torchrun_part("5543"), TRAIN, "--steps", "20"],
                          tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("finished 20 steps on attempt 0") == 2, res.stdout
    assert "[rank1]:" in res.stdout  # --tee 3: prefixed worker output on the console
    # The job's id is the user's --rdzv-id, as under ft_launcher (not a fresh standalone one).
    assert "_5543_" in next(tmp_path.glob("*/events.jsonl")).parent.name


def test_the_line_with_fault_tolerance_parameters_recovers_a_stopped_rank(tmp_path):
    ft = ["--ft-workload_check_interval", "5", "--ft-initial_rank_heartbeat_timeout", "120",
          "--ft-rank_heartbeat_timeout", "4", "--ft-rank_termination_signal", "SIGKILL", "--ft-log_level", "INFO",
          "--max-restarts", "3"]
    res, events = _launch([*ft, *torchrun_part("1234"), TRAIN, "--steps", "30", "--stop-rank", "1"], tmp_path)
    assert res.returncode == 0, res.stderr
    hangs = [e for e in events if e["event"] == "hang"]  # the deadline that ran out first (either rank's)
    assert len(hangs) == 1 and hangs[0]["kind"] == "heartbeat", hangs
    failures = [e for e in events if e["event"] == "failure"]
    assert len(failures) == 1 and failures[0]["cause"] == "hang", failures
    assert failures[0]["rank"] == 1 and "stopped" in failures[0]["detail"], failures[0]  # the culprit, named
    assert res.stdout.count("finished 30 steps on attempt 1") == 2, res.stdout
