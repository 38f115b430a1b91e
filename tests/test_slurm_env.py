"""Fast tests of mbr_launch.config.slurm over tables of environment variables (no cluster needed).

The env tables are trimmed copies of what Slurm 22.05 really exported on the local test cluster.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from mbr_launch.config.slurm import SlurmEnv, SlurmError, parse_nodelist, parse_tasks_per_node
from testkit import slurm_testbed

pytestmark = pytest.mark.timeout(30)

# ---- parse_nodelist ------------------------------------------------------------------------------

GOOD = {
    "n1": ["n1"],
    "n[1-3]": ["n1", "n2", "n3"],
    "n[9-11]": ["n9", "n10", "n11"],
    "node[001-010]": [f"node{i:03d}" for i in range(1, 11)],
    "x[01-3]": ["x01", "x02", "x03"],  # the low end sets the padding, as in Slurm
    "x[1-03]": ["x1", "x2", "x3"],
    "n[0]": ["n0"],
    "gpu-a[01-03,07],gpu-b12": ["gpu-a01", "gpu-a02", "gpu-a03", "gpu-a07", "gpu-b12"],
    "a[1-2]-b[3-4]": ["a1-b3", "a1-b4", "a2-b3", "a2-b4"],
    "a[1-2,5]b[1-2,7]": ["a1b1", "a1b2", "a1b7", "a2b1", "a2b2", "a2b7", "a5b1", "a5b2", "a5b7"],
    # Slurm's quirky order for three groups: the middle group is outermost.
    "a[1-2]b[1-2]c[1-2]": ["a1b1c1", "a1b1c2", "a2b1c1", "a2b1c2", "a1b2c1", "a1b2c2", "a2b2c1", "a2b2c2"],
    "n1x[1-2]": ["n1x1", "n1x2"],
    "n1,n2": ["n1", "n2"],
    "n1, n2": ["n1", "n2"],
    "n1 n2": ["n1", "n2"],
    " n[1-2] ": ["n1", "n2"],
    "n[1-2],": ["n1", "n2"],
    "n1,n1": ["n1", "n1"],  # Slurm keeps duplicates
    "n1-2": ["n1-2"],  # a dash outside brackets is part of the name
    "host.example.org": ["host.example.org"],
    "a[1-2]b[3-4],a[5]b[6]": ["a1b3", "a1b4", "a2b3", "a2b4", "a5b6"],
    "a[1-2]b[1-2]c[1-2]d[1-2]": [
        f"a{a}b{b}c{c}d{d}" for c in (1, 2) for b in (1, 2) for a in (1, 2) for d in (1, 2)
    ],
}

BAD = ["", "   ", ",", "gpu[01-", "gpu[3-1]", "a[]", "a[1,,2]", "n[-1]", "n[1-]", "n[a-b]", "a]",
       "n[1-2", "n[1-2]]", "n[[1-2]", "n[1-2]x", "a[1-2]b5", "]n[", "n[0-99999999]"]


@pytest.mark.parametrize("text", GOOD)
def test_parse_nodelist(text: str) -> None:
    assert parse_nodelist(text) == GOOD[text]


@pytest.mark.parametrize("text", BAD)
def test_parse_nodelist_rejects_and_quotes(text: str) -> None:
    with pytest.raises(SlurmError) as e:
        parse_nodelist(text)
    assert repr(text) in str(e.value)


@pytest.mark.processes
@pytest.mark.skipif(shutil.which("scontrol") is None, reason="scontrol missing: run .ci/slurm-setup.sh")
def test_parse_nodelist_agrees_with_scontrol(tmp_path: Path) -> None:
    # scontrol show hostnames needs no running cluster, but it reads a slurm.conf first: give it one of
    # its own, so the test passes whether or not an earlier test wrote /etc/slurm/slurm.conf.
    env = {**os.environ, "SLURM_CONF": str(slurm_testbed.scratch_conf(tmp_path))}
    for text in GOOD:  # one call per form keeps failures readable
        out = subprocess.run(["scontrol", "show", "hostnames", text], capture_output=True, text=True,
                             timeout=10, check=True, env=env).stdout.split()
        assert parse_nodelist(text) == out, text


# ---- parse_tasks_per_node ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "want"),
    [("1", [1]), ("2(x3),1", [2, 2, 2, 1]), ("1(x2)", [1, 1]), ("4,2(x2)", [4, 2, 2]), (" 3 ( x2 ) ", [3, 3])],
)
def test_parse_tasks_per_node(text: str, want: list[int]) -> None:
    assert parse_tasks_per_node(text) == want


@pytest.mark.parametrize("text", ["", "x", "2(x)", "2(3)", "2(x0)", "-1", "2(x3", "1,,2"])
def test_parse_tasks_per_node_rejects(text: str) -> None:
    with pytest.raises(SlurmError, match=repr(text).replace("(", r"\(").replace(")", r"\)")):
        parse_tasks_per_node(text)


# ---- SlurmEnv ------------------------------------------------------------------------------------

# One task of `srun -N2 --ntasks-per-node=1` (node n2), as exported by Slurm 22.05.
SRUN_TASK = {
    "SLURM_JOB_ID": "2", "SLURM_JOBID": "2", "SLURM_JOB_NAME": "bash",
    "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_NODELIST": "n[1-2]", "SLURM_NNODES": "2",
    "SLURM_JOB_NUM_NODES": "2", "SLURM_TASKS_PER_NODE": "1(x2)", "SLURM_NTASKS": "2",
    "SLURM_STEP_ID": "0", "SLURM_STEPID": "0", "SLURM_STEP_NODELIST": "n[1-2]",
    "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
    "SLURM_NODEID": "1", "SLURM_PROCID": "1", "SLURM_LOCALID": "0", "SLURMD_NODENAME": "n2",
}
# The batch script of `sbatch -N2 --ntasks-per-node=3`: no step variables at all.
BATCH_SCRIPT = {
    "SLURM_JOB_ID": "7", "SLURM_JOBID": "7", "SLURM_JOB_NAME": "b.sh", "SLURM_JOB_NODELIST": "n[1-2]",
    "SLURM_NODELIST": "n[1-2]", "SLURM_NNODES": "2", "SLURM_JOB_NUM_NODES": "2",
    "SLURM_TASKS_PER_NODE": "3(x2)", "SLURM_NTASKS": "6", "SLURM_NODEID": "0", "SLURM_PROCID": "0",
    "SLURMD_NODENAME": "n1",
}


def test_not_under_slurm() -> None:
    assert SlurmEnv.from_environ({}) is None
    assert SlurmEnv.from_environ({"PATH": "/bin", "SLURM_CONF": "/etc/slurm/slurm.conf"}) is None
    assert SlurmEnv.from_environ({"SLURM_JOB_ID": ""}) is None


def test_srun_task() -> None:
    env = SlurmEnv.from_environ(SRUN_TASK)
    assert env is not None
    assert env.in_step and env.step_id == "0" and env.job_id == "2" and env.job_name == "bash"
    assert env.nodelist == ("n1", "n2") and env.nnodes() == 2 and env.node_rank() == 1
    assert env.proc_id == 1 and env.ntasks == 2 and env.hostname == "n2"
    assert env.tasks_on_this_node() == 1
    assert env.rdzv_endpoint(29400) == "n1:29400"
    assert env.run_id() == "slurm-2-0-r0"
    assert env.restart_count == 0 and env.kill_on_bad_exit is None
    assert env.check_one_launcher_per_node() is None
    assert env.kill_on_bad_exit_warning() is None


def test_frozen() -> None:
    env = SlurmEnv.from_environ(SRUN_TASK)
    with pytest.raises(dataclasses.FrozenInstanceError):
        env.job_id = "3"  # type: ignore[misc]


def test_step_values_win_over_job_values() -> None:
    # `srun -N1 -n4` inside a 4-node job: the launcher belongs to the step, not the allocation.
    env = SlurmEnv.from_environ({
        "SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": "gpu[01-04]", "SLURM_NNODES": "4",
        "SLURM_TASKS_PER_NODE": "8(x4)", "SLURM_NTASKS": "32",
        "SLURM_STEP_ID": "3", "SLURM_STEP_NODELIST": "gpu03", "SLURM_STEP_NUM_NODES": "1",
        "SLURM_STEP_TASKS_PER_NODE": "4", "SLURM_STEP_NUM_TASKS": "4", "SLURM_NODEID": "0",
        "SLURMD_NODENAME": "gpu03",
    })
    assert env is not None
    assert env.nodelist == ("gpu03",) and env.nnodes() == 1 and env.ntasks == 4
    assert env.rdzv_endpoint(1234) == "gpu03:1234"
    msg = env.check_one_launcher_per_node()
    assert msg is not None and "runs 4 tasks on node gpu03" in msg and "--ntasks-per-node=1" in msg


def test_uneven_tasks_per_node() -> None:
    env = SlurmEnv.from_environ({**SRUN_TASK, "SLURM_STEP_NODELIST": "n[1-4]", "SLURM_STEP_NUM_NODES": "4",
                                 "SLURM_STEP_TASKS_PER_NODE": "1(x3),2", "SLURM_NODEID": "3",
                                 "SLURMD_NODENAME": "n4"})
    assert env is not None and env.tasks_on_this_node() == 2
    assert "runs 2 tasks on node n4" in (env.check_one_launcher_per_node() or "")
    other = dataclasses.replace(env, node_id=0, hostname="n1")
    assert other.check_one_launcher_per_node() is None


def test_batch_script() -> None:
    env = SlurmEnv.from_environ(BATCH_SCRIPT)
    assert env is not None and not env.in_step
    assert env.run_id() == "slurm-7-batch-r0"
    # The allocation's 3 tasks per node do not matter: the batch script runs once, on n1 only.
    msg = env.check_one_launcher_per_node()
    assert msg is not None and "outside an srun step" in msg and "2-node job" in msg and "srun" in msg
    one_node = SlurmEnv.from_environ({**BATCH_SCRIPT, "SLURM_JOB_NODELIST": "n1", "SLURM_NODELIST": "n1",
                                      "SLURM_NNODES": "1", "SLURM_JOB_NUM_NODES": "1",
                                      "SLURM_TASKS_PER_NODE": "3"})
    assert one_node is not None and one_node.check_one_launcher_per_node() is None


def test_salloc_shell() -> None:
    # `salloc -N2` runs its shell on the submit host: no node id, no slurmd node name, no step.
    env = SlurmEnv.from_environ({"SLURM_JOB_ID": "2", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_NNODES": "2",
                                 "SLURM_TASKS_PER_NODE": "1(x2)"})
    assert env is not None and not env.in_step and env.node_id is None and env.hostname is None
    assert env.tasks_on_this_node() is None
    assert "so only this node runs it" in (env.check_one_launcher_per_node() or "")


def test_run_id_differs_per_step_and_requeue() -> None:
    base = SlurmEnv.from_environ(SRUN_TASK)
    step1 = SlurmEnv.from_environ({**SRUN_TASK, "SLURM_STEP_ID": "1", "SLURM_STEPID": "1"})
    requeued = SlurmEnv.from_environ({**SRUN_TASK, "SLURM_RESTART_COUNT": "1"})
    other_node = SlurmEnv.from_environ({**SRUN_TASK, "SLURM_NODEID": "0", "SLURMD_NODENAME": "n1",
                                        "SLURM_PROCID": "0"})
    assert base and step1 and requeued and other_node
    assert len({base.run_id(), step1.run_id(), requeued.run_id()}) == 3
    assert requeued.restart_count == 1 and requeued.run_id() == "slurm-2-0-r1"
    assert other_node.run_id() == base.run_id()  # every node of one step must agree


def test_fallback_variable_names() -> None:
    env = SlurmEnv.from_environ({"SLURM_JOBID": "9", "SLURM_STEPID": "2", "SLURM_NODELIST": "a[1-3]",
                                 "SLURM_NODEID": "2", "SLURM_NPROCS": "3"})
    assert env is not None
    assert env.job_id == "9" and env.step_id == "2" and env.nnodes() == 3 and env.ntasks == 3
    assert env.tasks_per_node == () and env.tasks_on_this_node() is None
    assert env.hostname is None and env.check_one_launcher_per_node() is None


def test_node_rank_missing() -> None:
    env = SlurmEnv.from_environ({"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "n1"})
    assert env is not None and env.node_id is None
    with pytest.raises(SlurmError, match="--node-rank"):
        env.node_rank()


@pytest.mark.parametrize(("value", "want"), [("1", True), ("0", False), ("2", True)])
def test_kill_on_bad_exit(value: str, want: bool) -> None:
    env = SlurmEnv.from_environ({**SRUN_TASK, "SLURM_KILL_BAD_EXIT": value})
    assert env is not None and env.kill_on_bad_exit is want
    warning = env.kill_on_bad_exit_warning()
    assert (warning is not None) is want
    if warning:
        assert "--kill-on-bad-exit=0" in warning


@pytest.mark.parametrize(
    ("extra", "quoted"),
    [
        ({"SLURM_STEP_NODELIST": "n[1-"}, "SLURM_STEP_NODELIST='n[1-'"),
        ({"SLURM_NODEID": "x"}, "SLURM_NODEID='x'"),
        ({"SLURM_NODEID": "-1"}, "SLURM_NODEID='-1'"),
        ({"SLURM_NODEID": "5"}, "SLURM_NODEID=5"),
        ({"SLURM_STEP_NUM_NODES": "3"}, "3 nodes"),
        ({"SLURM_STEP_TASKS_PER_NODE": "1(x3)"}, "(1, 1, 1)"),
        ({"SLURM_STEP_TASKS_PER_NODE": "1(y2)"}, "'1(y2)'"),
        ({"SLURM_RESTART_COUNT": "one"}, "SLURM_RESTART_COUNT='one'"),
        ({"SLURM_KILL_BAD_EXIT": "yes"}, "SLURM_KILL_BAD_EXIT='yes'"),
    ],
)
def test_bad_environment_is_named(extra: dict[str, str], quoted: str) -> None:
    with pytest.raises(SlurmError) as e:
        SlurmEnv.from_environ({**SRUN_TASK, **extra})
    assert quoted in str(e.value)


def test_job_id_without_nodelist() -> None:
    with pytest.raises(SlurmError, match="SLURM_JOB_ID='42'.*--rdzv-endpoint"):
        SlurmEnv.from_environ({"SLURM_JOB_ID": "42"})


@pytest.mark.parametrize("port", [0, -1, 65536])
def test_rdzv_endpoint_port_range(port: int) -> None:
    env = SlurmEnv.from_environ(SRUN_TASK)
    assert env is not None
    with pytest.raises(SlurmError, match=str(port)):
        env.rdzv_endpoint(port)
