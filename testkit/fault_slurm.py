"""Fault scenarios under real Slurm (testkit/slurm_cluster.py: 2 nodes, one launcher per node): preemption by
scancel --signal=USR1, and by --signal=TERM with --requeue-on-preemption (the table is testkit/fault_cases.py).

Agents write their events under the case's directory (the same filesystem inside the node namespaces), and
so do the workers' logs and checkpoints. A run's agents are its launchers in '<run id>/<node>' order, so
exit codes and events line up with ``Case.exits`` (a requeued job adds the second run's launchers)."""

from __future__ import annotations

import os
import signal
import time
from datetime import datetime
from pathlib import Path

from .fault_runs import Ctx, Run, log_problem
from .slurm_jobs import (LAUNCH_ENV, PREEMPTIBLE, agent_events, batch, launch_cmd, one_event, preempt_log, wait_gone,
                         wait_running)


def _run(ctx: Ctx, logs: Path, t_fault: float, **info: object) -> Run:
    agents = agent_events(logs)
    keys = sorted(agents)
    ends = [next((e["exit_code"] for e in agents[k] if e["event"] == "end"), None) for k in keys]
    out = (ctx.tmp / "out").read_text() if (ctx.tmp / "out").exists() else ""
    cut = [problem for path in sorted(logs.glob("*/events.jsonl")) if (problem := log_problem(path))]
    return Run(codes=ends, stdout=[out] * len(keys), stderr=[out] * len(keys), events=[agents[k] for k in keys],
               t_fault=t_fault, t_start=ctx.t_start, t_end=time.time(), cut_logs=cut, info={"keys": keys, **info})


def slurm_usr1(ctx: Ctx) -> Run:
    """scancel --signal=USR1 reaches every process of the step, the workers included. Rank 0 keeps the boot
    shim's SIG_IGN; rank 1 records the USR1 it gets straight from Slurm. Slurm sends nothing else, so each
    worker's SIGTERM comes from its launcher: both checkpoint and exit 0, the job exits 5."""
    cluster, tmp = ctx.cluster, ctx.tmp
    log, logs = tmp / "log", tmp / "logs"
    script = batch("srun --kill-on-bad-exit=0", launch_cmd(
        "--nproc-per-node", "1", "--log-dir", str(logs), "--preempt-grace", "8", PREEMPTIBLE,
        "--steps", "100000", "--ckpt-dir", str(tmp / "ckpt"), "--log", str(log), "--note-signal-rank", "1"))
    job, _ = cluster.sbatch(script, ["-N2", "--ntasks-per-node=1", f"--output={tmp}/out"], timeout=30, wait=False,
                            env={**LAUNCH_ENV, **ctx.env})
    wait_running(cluster, log, 2, job)
    t_fault = time.time()
    cluster.run(["scancel", "--signal=USR1", job], 10)
    job_info = wait_gone(cluster, job, 40)
    return _run(ctx, logs, t_fault, job=job, job_info=job_info, rows=preempt_log(log),
                checkpoint=(tmp / "ckpt" / "latest.pt").is_file())


def check_usr1(run: Run) -> None:
    assert run.info["job_info"]["ExitCode"] == "5:0", run.stdout[0][-4000:]
    _step_wide(run, run.info["keys"])
    rows = run.info["rows"]
    got = {rank: [what for r, what, _kv in rows if r == rank] for rank in (0, 1)}
    usr1 = {rank: kv["usr1"] for rank, what, kv in rows if what == "running"}
    assert usr1 == {0: "SIG_IGN", 1: "handler"}, usr1
    assert got[1].count("SIGUSR1") == 1, got  # delivered by Slurm: the launcher never sends USR1
    assert "SIGUSR1" not in got[0], got
    steps = {kv["step"] for _r, what, kv in rows if what == "checkpoint"}
    # Each launcher sends its own workers one SIGTERM. The ranks agree on the stop step (all_reduce of the flag),
    # so a rank whose launcher was the slower of the two may checkpoint on its peer's flag before its own SIGTERM
    # comes (then noted after the checkpoint, or not at all once it exited): seen in CI as running, SIGUSR1,
    # checkpoint, SIGTERM. The first SIGTERM to arrive is what stopped the job.
    for rank in (0, 1):
        assert got[rank].count("checkpoint") == 1 and got[rank].count("SIGTERM") <= 1, got
        assert set(got[rank][got[rank].index("checkpoint") + 1:]) <= {"SIGTERM"}, got
    assert any(got[r].count("SIGTERM") and got[r].index("SIGTERM") < got[r].index("checkpoint") for r in (0, 1)), got
    assert len(steps) == 1, rows  # every rank stopped after the same step
    assert run.info["checkpoint"], "no checkpoint written"
    assert len(run.events) == 2, run.info["keys"]
    for key, events in zip(run.info["keys"], run.events):
        assert one_event(events, "preemption")["signal"] == "SIGUSR1", key
        exit_ = one_event(events, "worker_exit")
        assert (exit_["exit_code"], exit_["signal"]) == (0, None), key  # not USR1's default, not SIGKILL
        assert one_event(events, "end")["reason"] == "preempted by SIGUSR1", key


def slurm_term_requeue(ctx: Ctx) -> Run:
    """scancel --signal=TERM: the workers checkpoint, both launchers exit 5, node 0 requeues the job, which
    comes back with SLURM_RESTART_COUNT=1 (a fresh run id, r1) and resumes from that checkpoint.

    Slurm counts a SIGTERM to a step as a cancel ("STEP CANCELLED", srun waits KillWait + 2 s, 12 s here,
    then kills the step), so the grace must stay below KillWait: --preempt-grace 8."""
    cluster, tmp = ctx.cluster, ctx.tmp
    log, logs = tmp / "log", tmp / "logs"
    script = ("#!/bin/bash\necho \"restart ${SLURM_RESTART_COUNT:-unset}\"\n" + batch(
        "srun --kill-on-bad-exit=0", launch_cmd(
            "--nproc-per-node", "1", "--log-dir", str(logs), "--preempt-grace", "8", "--requeue-on-preemption",
            PREEMPTIBLE, "--steps", "100", "--ckpt-dir", str(tmp / "ckpt"), "--log", str(log))))
    job, _ = cluster.sbatch(script, ["-N2", "--ntasks-per-node=1", "--requeue", "--open-mode=append",
                                     f"--output={tmp}/out"], timeout=30, wait=False, env={**LAUNCH_ENV, **ctx.env})
    wait_running(cluster, log, 2, job)
    t_fault = time.time()
    cluster.run(["scancel", "--signal=TERM", job], 10)
    cluster.wait_for(f"job {job} to be requeued", lambda: cluster.job(job).get("Restarts") == "1", 30)
    job_info = wait_gone(cluster, job, 90)
    return _run(ctx, logs, t_fault, job=job, job_info=job_info, rows=preempt_log(log))


def check_requeue(run: Run) -> None:
    info, out, job = run.info["job_info"], run.stdout[0] if run.stdout else "", run.info["job"]
    assert (info["JobState"], info["ExitCode"], info["Restarts"]) == ("COMPLETED", "0:0", "1"), out[-4000:]
    assert [line for line in out.splitlines() if line.startswith("restart ")] == ["restart unset", "restart 1"]
    rows = run.info["rows"]
    saved = {kv["step"] for _r, what, kv in rows if what == "checkpoint"}
    assert len(saved) == 1, rows
    step = saved.pop()
    assert sorted((rank, kv["step"]) for rank, what, kv in rows if what == "resumed") == [(0, step), (1, step)]
    assert sorted((rank, kv["slurm_restart"]) for rank, what, kv in rows if what == "running") == [
        (0, "0"), (0, "1"), (1, "0"), (1, "1")]
    assert sorted(r for r, what, _kv in rows if what == "finished") == [0, 1]
    assert run.info["keys"] == [f"slurm-{job}-0-r{n}/{node}" for n in (0, 1) for node in ("n1", "n2")], run.info["keys"]
    for key, events in zip(run.info["keys"], run.events):
        if "-r0/" in key:
            assert one_event(events, "preemption")["signal"] == "SIGTERM", key
    _step_wide(run, [key for key in run.info["keys"] if "-r0/" in key])
    requeues = [e for events in run.events for e in events if e["event"] == "requeue"]
    assert [(e["node"], e["ok"]) for e in requeues] == [("n1", True)], requeues  # node 0 alone asks


def _step_wide(run: Run, keys: list[str]) -> None:
    """Each node knew the signal for the job's from its own rank monitor (Slurm signalled every process of the
    step), not from the other nodes' records: it holds however late one node sees its signal."""
    for key in keys:
        reached = one_event(run.events[run.info["keys"].index(key)], "signal_reach")
        assert (reached["reach"], reached["by"]) == ("job", "step"), (key, reached)


LATE = 10.0  # seconds n2's launcher is held stopped: more than half of the default --peer-timeout (15 s)


def slurm_term_one_late(ctx: Ctx) -> Run:
    """scancel --signal=TERM while n2's launcher is stopped (SIGSTOP), resumed LATE seconds later: n2 sees the
    job's signal long after n1 has, as a node of a loaded machine may. n1 serves the store: had it waited for
    n2's record, it would have left alone and ended the job with exit 3. Each knows the job's stop from its own
    rank monitor: both exit 5."""
    cluster, tmp = ctx.cluster, ctx.tmp
    log, logs = tmp / "log", tmp / "logs"
    script = batch("srun --kill-on-bad-exit=0", launch_cmd(
        "--nproc-per-node", "1", "--log-dir", str(logs), "--preempt-grace", "8", PREEMPTIBLE,
        "--steps", "100000", "--ckpt-dir", str(tmp / "ckpt"), "--log", str(log)))
    job, _ = cluster.sbatch(script, ["-N2", "--ntasks-per-node=1", f"--output={tmp}/out"], timeout=30, wait=False,
                            env={**LAUNCH_ENV, **ctx.env})
    wait_running(cluster, log, 2, job)
    late = step_task(job, "n2")
    os.kill(late, signal.SIGSTOP)
    try:
        t_fault = time.time()
        cluster.run(["scancel", "--signal=TERM", job], 10)
        time.sleep(LATE)  # the scenario itself: how late n2 sees the signal (a busier machine only adds to it)
    finally:
        os.kill(late, signal.SIGCONT)
        resumed = time.time()
    job_info = wait_gone(cluster, job, 60)
    return _run(ctx, logs, t_fault, job=job, job_info=job_info, rows=preempt_log(log), resumed=resumed)


def check_one_late(run: Run) -> None:
    _step_wide(run, run.info["keys"])
    seen = _seconds(one_event(run.events[1], "signal")["ts"])
    assert seen >= run.info["resumed"] - 0.01, (seen, run.info["resumed"])  # n2 saw it LATE s after scancel


def _seconds(ts: str) -> float:
    return datetime.fromisoformat(ts).timestamp()


def slurm_kill_one(ctx: Ctx) -> Run:
    """A plain ``kill`` (SIGTERM) of n2's launcher inside a 2-node step (--nnodes 1:2): Slurm sent nothing, so
    n2's rank monitor has no signal pending and n2 waits for the other node's record, which never comes: it
    leaves (exit 6) once half of --peer-timeout (15 s) has passed. Its rank checkpoints on the SIGTERM and the
    example stops both ranks at that step, so n1's rank ends well and n1 exits 0, never stopped by the signal."""
    cluster, tmp = ctx.cluster, ctx.tmp
    log, logs = tmp / "log", tmp / "logs"
    script = batch("srun --kill-on-bad-exit=0", launch_cmd(
        "--nproc-per-node", "1", "--nnodes", "1:2", "--max-restarts", "1", "--log-dir", str(logs), PREEMPTIBLE,
        "--steps", "100000", "--ckpt-dir", str(tmp / "ckpt"), "--log", str(log)))
    job, _ = cluster.sbatch(script, ["-N2", "--ntasks-per-node=1", f"--output={tmp}/out"], timeout=30, wait=False,
                            env={**LAUNCH_ENV, **ctx.env})
    wait_running(cluster, log, 2, job)
    launcher = step_task(job, "n2")
    t_fault = time.time()
    os.kill(launcher, signal.SIGTERM)
    job_info = wait_gone(cluster, job, 60)
    return _run(ctx, logs, t_fault, job=job, job_info=job_info, rows=preempt_log(log))


def check_kill_one(run: Run) -> None:
    n1, n2 = run.events
    reached = one_event(n2, "signal_reach")
    assert (reached["reach"], reached["by"], reached["signalled"]) == ("node", "window", 1), reached
    assert one_event(n2, "node_left")["next"] == "go on"
    assert not [e for e in n1 if e["event"] in ("signal", "signal_reach", "preemption")], n1[-5:]


def step_task(job: str, node: str) -> int:
    """The pid of job ``job``'s step task on ``node`` (the launcher srun started there: slurmstepd's child). The
    test cluster's nodes share this machine's process table."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{entry}/stat", "rb") as f:
                ppid = int(f.read().rpartition(b")")[2].split()[1])
            with open(f"/proc/{ppid}/comm", "rb") as f:
                parent = f.read().strip()
        except (OSError, ValueError, IndexError):
            continue
        if parent == b"slurmstepd" and f"SLURM_JOB_ID={job}".encode() in env and \
                f"SLURMD_NODENAME={node}".encode() in env:
            return int(entry)
    raise AssertionError(f"no step task of job {job} on {node}")
