"""mbr-launch under real Slurm: a 2-node job (testkit/slurm_cluster.py), one launcher per node.

What each test proves:
- the sbatch example runs to completion, and a worker crash on one node is restarted inside the same
  srun step (srun --kill-on-bad-exit=0 leaves the step alone; the launchers restart the workers);
- a hang with the culprit on the second node: both agents' verdicts name it, and only its node records the failure;
- cutting one node's link: both launchers end on their own, nothing is left behind;
- two tasks on one node are refused with exit code 2.

Preemption (scancel --signal=USR1, and --signal=TERM with the requeue) is in the fault matrix:
testkit/fault_slurm.py, run by tests/test_fault_matrix.py.

Agents write their events under the test's tmp_path (the same filesystem inside the node namespaces), and
so do the workers' logs and checkpoints.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from testkit.slurm_cluster import REPO, ClusterError, SlurmCluster
from testkit.slurm_jobs import (LAUNCH_ENV, MBR_LAUNCH, PREEMPTIBLE, agent_events, batch, launch_cmd, one_event,
                              wait_gone, wait_running)

pytestmark = [pytest.mark.slurm, pytest.mark.processes]

# ---- tests ---------------------------------------------------------------------------------------


@pytest.mark.timeout(150)
def test_sbatch_example_restarts_a_crash_in_the_step(slurm_clean: SlurmCluster, tmp_path: Path) -> None:
    """examples/sbatch_train.sh as a user submits it (from the repo root); rank 3 on the second node
    SIGKILLs itself at step 12 and the launchers restart all ranks inside the same srun step."""
    env = {**LAUNCH_ENV, "CKPT_DIR": str(tmp_path / "ckpt"), "MBR_LOG_DIR": str(tmp_path / "logs")}
    r = slurm_clean.run(["sbatch", "--wait", "--parsable", f"--output={tmp_path}/out", "examples/sbatch_train.sh",
                         "--steps", "20", "--fault-step", "12", "--fault-rank", "3"],
                        120, check=False, env=env, cwd=REPO)
    out = (tmp_path / "out").read_text()
    assert r.returncode == 0, out[-4000:]
    job = r.stdout.strip().split(";")[0]
    assert slurm_clean.job(job)["ExitCode"] == "0:0"
    assert f"checkpoints in {tmp_path / 'ckpt'}" in out  # CKPT_DIR from the environment wins
    assert "[attempt 0] rank 3: injecting a crash at step 12" in out
    assert "[attempt 1] resumed from step 10" in out
    assert "[attempt 1] finished 20 steps on 4 ranks" in out

    agents = agent_events(tmp_path / "logs")
    # One step (0), one launcher per node, each alive through both rounds: the step was not killed.
    assert sorted(agents) == [f"slurm-{job}-0-r0/n1", f"slurm-{job}-0-r0/n2"], sorted(agents)
    for key, events in agents.items():
        assert [e["round"] for e in events if e["event"] == "worker_start"] == [0, 0, 1, 1], key
        assert one_event(events, "restart")["restart_count"] == 1, key
        assert one_event(events, "end")["exit_code"] == 0, key
    # (rank 2 may fail too, of the gloo error, before its launcher stops it)
    failures = [(e["rank"], e["signal"]) for e in agents[f"slurm-{job}-0-r0/n2"] if e["event"] == "failure"]
    assert (3, "SIGKILL") in failures, failures


@pytest.mark.timeout(120)
def test_hang_verdict_names_the_culprit_on_the_other_node(slurm_clean: SlurmCluster, tmp_path: Path) -> None:
    """Two nodes, one rank each; rank 1 (on n2) sleeps inside a step while rank 0 (on n1) blocks in the step's
    all_reduce, so both deadlines pass together. Whichever node opens the inquiry, both agents' verdicts name
    rank 1 on n2, and the failure is recorded there."""
    logs = tmp_path / "logs"
    script = batch("srun --kill-on-bad-exit=0", launch_cmd(
        "--nproc-per-node", "1", "--log-dir", str(logs), "--max-restarts", "0", "--step-timeout", "3",
        "--hang-kill-grace", "1", "--skip-check", "all", "--status", "off",
        str(REPO / "tests" / "scripts" / "hangs.py"), "--scenario", "sleep", "--culprit", "1", "--hang-step", "20"))
    job, _ = slurm_clean.sbatch(script, ["-N2", "--ntasks-per-node=1", f"--output={tmp_path}/out"],
                                timeout=30, wait=False, env=LAUNCH_ENV)
    info = wait_gone(slurm_clean, job, 90)
    out = (tmp_path / "out").read_text()
    assert info["ExitCode"] == "1:0", out[-4000:]
    agents = agent_events(logs)
    assert sorted(agents) == [f"slurm-{job}-0-r0/n1", f"slurm-{job}-0-r0/n2"], sorted(agents)
    for key, events in agents.items():
        verdict = [e for e in events if e["event"] == "verdict"]
        assert verdict, f"{key}: no verdict\n{out[-3000:]}"
        assert (verdict[0]["culprits"], verdict[0]["nodes"], verdict[0]["waiting"]) == ([1], ["n2"], [0]), key
    failures = [(e["rank"], e["cause"]) for e in agents[f"slurm-{job}-0-r0/n2"] if e["event"] == "failure"]
    assert failures[:1] == [(1, "hang")], failures
    assert not [e for e in agents[f"slurm-{job}-0-r0/n1"] if e["event"] == "failure"]  # n1's rank only waited


# After the cut: --peer-timeout 5 s, --shutdown-timeout 5 s to kill the worker blocked in gloo,
# then join_timeout 15 s for the re-rendezvous that cannot form; the survivor ends ~25 s after the cut.
# Heal before SlurmdTimeout (60 s) so Slurm never steps in.
CUT_DEADLINE = 40.0


@pytest.mark.timeout(240)
def test_cut_node_link_ends_both_launchers(slurm_clean: SlurmCluster, tmp_path: Path) -> None:
    """Take n2's link down mid-training (job-scope policy, one restart allowed). The survivor notices the
    silent peer, stops its worker, and with the budget left re-rendezvouses, which cannot complete
    without n2 (join_timeout 15 s): it ends with 1 or 3. The cut node cannot reach the store on n1 and
    must end on its own too. Neither may wait for Slurm, which only reacts after SlurmdTimeout."""
    log, logs = tmp_path / "log", tmp_path / "logs"
    name = f"mbrtest-{uuid.uuid4().hex[:8]}"
    srun = subprocess.Popen(
        ["srun", f"--job-name={name}", "-N2", "--ntasks-per-node=1", "--kill-on-bad-exit=0", MBR_LAUNCH,
         "--nproc-per-node", "1", "--max-restarts", "1", "--shutdown-timeout", "5", "--peer-timeout", "5",
         "--rdzv-conf", "join_timeout=15", "--log-dir", str(logs), PREEMPTIBLE, "--steps", "100000",
         "--ckpt-dir", str(tmp_path / "ckpt"), "--log", str(log)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=LAUNCH_ENV, cwd="/tmp",
        start_new_session=True)
    ends: dict[str, dict] = {}
    try:
        slurm_clean.wait_for("the job to start", lambda: any(j["name"] == name for j in slurm_clean.squeue()), 30)
        job = next(j["id"] for j in slurm_clean.squeue() if j["name"] == name)
        wait_running(slurm_clean, log, 2, job)
        slurm_clean.cut("n2")
        cut_at = time.monotonic()

        def ended() -> bool:
            ends.update({key.rsplit("/", 1)[1]: e for key, events in agent_events(logs).items()
                         for e in events if e["event"] == "end"})
            return len(ends) == 2

        try:
            slurm_clean.wait_for("both launchers to end", ended, CUT_DEADLINE, every=0.5)
        except ClusterError:
            pass  # the assertions below say which one did not end
        waited = time.monotonic() - cut_at
        assert "n1" in ends, f"the survivor (n1) did not end within {waited:.0f} s of the cut"
        assert ends["n1"]["exit_code"] in (1, 3), ends["n1"]
        assert "n2" in ends, (f"the cut node's launcher (n2) did not end within {waited:.0f} s of the cut; "
                              f"its last events: {list(agent_events(logs).values())}")
        assert ends["n2"]["exit_code"] in (1, 3), ends["n2"]  # not 5: no signal came, Slurm could not reach it
    finally:
        slurm_clean.heal("n2")
        slurm_clean.run(["scancel", f"--name={name}"], 10, check=False)
        try:
            srun.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(srun.pid, signal.SIGKILL)
            srun.communicate()
        slurm_clean.settle(name, 90)  # a job that ran on the cut node may need its node forced out of CG


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("layout", "tasks"), [(["-N1", "-n2"], 2), (["-N2", "--ntasks-per-node=2"], 4)])
def test_two_tasks_on_a_node_are_refused(slurm_clean: SlurmCluster, layout: list[str], tasks: int) -> None:
    r = slurm_clean.srun([*layout, "--kill-on-bad-exit=0", MBR_LAUNCH, "--nproc-per-node", "1", PREEMPTIBLE],
                         timeout=40, check=False, env=LAUNCH_ENV)
    assert r.returncode == 2, r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("mbr-launch: error:")]
    assert len(errors) == tasks, r.stderr  # every task refuses, none starts a worker
    assert all("must run once per node: this step runs 2 tasks on node n" in line and "--ntasks-per-node=1" in line
               for line in errors), r.stderr
