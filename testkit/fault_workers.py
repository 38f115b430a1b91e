"""Fault scenarios of one node's workers and rank monitor (the table is testkit/fault_cases.py)."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path
from typing import Callable

from mbr_launch.report.events import event_time

from .fault_runs import (FT_WORKER, HANGS, PYTHON, SLEEPER, TRAIN, Ctx, Run, ScenarioError, cmdline,
                         descendants)

STANDALONE = ["--standalone", "--nproc-per-node", "2"]


def _pairs(path: Path) -> list[tuple[int, int]]:
    return sorted((int(line.split()[0]), int(line.split()[1])) for line in path.read_text().splitlines())


def trained(ctx: Ctx, max_restarts: int, *script: str) -> Run:
    """tests/scripts/train.py on 2 ranks; the fault time is the first line the faulty rank writes just before
    its crash or exit (--fault-file)."""
    ready, fault = ctx.tmp / "ready", ctx.tmp / "fault"
    ctx.mbr([*STANDALONE, "--max-restarts", str(max_restarts), TRAIN, *script, "--ready-file", str(ready),
             "--fault-file", str(fault)])
    ctx.finish()
    times = [float(line.split()[2]) for line in (fault.read_text().splitlines() if fault.exists() else [])]
    return ctx.result(min(times, default=None), ready=_pairs(ready))


def worker_sigkill(ctx: Ctx) -> Run:
    return trained(ctx, 1, "--crash-rank", "1")


def check_sigkill(run: Run) -> None:
    assert run.info["ready"] == [(0, 0), (0, 1), (1, 0), (1, 1)], run.info["ready"]
    assert "rank 1 (local rank 1)" in run.stderr[0] and "SIGKILL" in run.stderr[0], run.tail()
    rounds = [e for e in run.events[0] if e["event"] == "rendezvous"]
    assert [r["restart_count"] for r in rounds] == [0, 1], rounds
    assert rounds[0]["master_port"] != rounds[1]["master_port"], "the restart reused the master port"


def worker_exit(ctx: Ctx) -> Run:
    return trained(ctx, 1, "--exit-rank", "0", "--exit-code", "3")


def check_budget(run: Run) -> None:
    err = run.stderr[0]
    assert "restart budget exhausted" in err, run.tail()
    assert "rank 0 (local rank 0)" in err and "exit code 3" in err, run.tail()
    failures = [(e["round"], e["rank"], e["exit_code"]) for e in run.events[0] if e["event"] == "failure"]
    # rank 1 may also be recorded in round 0: rank 0's exit breaks its all_reduce, and on a loaded machine its
    # own error exit can come before the agent's stop reaches it (seen in CI). Every failure is recorded.
    assert [f for f in failures if f[1] == 0] == [(0, 0, 3), (1, 0, 3)], failures
    assert set(failures) <= {(0, 0, 3), (1, 0, 3), (0, 1, 1)}, failures
    assert f"mbr-launch failure summary ({len(failures)} failure(s), 1 restart(s))" in err, run.tail()


def worker_exit_no_restart(ctx: Ctx) -> Run:
    return trained(ctx, 3, "--exit-rank", "1", "--exit-code", "17")


def check_no_restart(run: Run) -> None:
    assert "exit code 17 is not restarted" in run.stderr[0], run.tail()
    assert len([e for e in run.events[0] if e["event"] == "rendezvous"]) == 1


# A rank stops in the NVRx heartbeat loop (tests/scripts/ft_worker.py): SIGSTOP or a GIL-holding busy loop.
HANG_TIMEOUT = 1.5
HANG_SLACK = 0.5  # detection within timeout + 0.5 s on 2 shared cores
STACK_METHOD = {"sigstop": "py-spy", "busy": "faulthandler"}  # a stopped process cannot run faulthandler


def nvrx_hang(kind: str) -> Callable[[Ctx], Run]:
    def scenario(ctx: Ctx) -> Run:
        ready = ctx.tmp / "ready"
        ctx.mbr([*STANDALONE, "--max-restarts", "1", "--stack-dump", STACK_METHOD[kind], "--hang-kill-grace", "1",
                 "--heartbeat-timeout", str(HANG_TIMEOUT), "--section-timeouts", "step:none", FT_WORKER, "--hang",
                 kind, "--ready-file", str(ready), "--hang-when-ready", "2", "--steps", "10", "--hang-attempt-steps", "400"])
        ctx.finish()
        started = re.search(rf"rank 1 hanging: {kind} at ([0-9.]+)", ctx.agents[0].stdout())
        return ctx.result(float(started.group(1)) if started else None, kind=kind, ready=_pairs(ready))
    return scenario


def check_nvrx_hang(run: Run) -> None:
    """Detected within the timeout + slack (by the monitor's clock and the worker's), every rank's stacks
    dumped by the asked method and summarised, then restarted."""
    kind = run.info["kind"]
    (hang,) = [e for e in run.events[0] if e["event"] == "hang"]
    assert HANG_TIMEOUT <= hang["elapsed"] <= HANG_TIMEOUT + HANG_SLACK, hang
    assert run.t_fault is not None and event_time(hang) - run.t_fault <= HANG_TIMEOUT + HANG_SLACK + 0.1, hang
    stacks = next(e for e in run.events[0] if e["event"] == "stacks")
    assert STACK_METHOD[kind] in stacks["method"], stacks  # rank 0 may have finished meanwhile ("none")
    dump = Path(next(p for p in stacks["paths"] if p and p.endswith("rank1.txt"))).read_text()
    assert f"# method: {STACK_METHOD[kind]}" in dump and "hang_now" in dump, dump
    assert "stacks:" in run.stderr[0] and "hang_now" in run.stderr[0], run.tail()
    assert run.info["ready"] == [(0, 0), (0, 1), (1, 0), (1, 1)], run.info["ready"]


def collective_hang(ctx: Ctx) -> Run:
    """Rank 1 waits in a barrier of a second process group while rank 0 waits in the step's all_reduce."""
    hang_file = ctx.tmp / "hang"
    ctx.mbr([*STANDALONE, "--max-restarts", "1", "--hang-kill-grace", "1", "--step-timeout", "3", HANGS,
             "--scenario", "other_collective", "--culprit", "1", "--hang-step", "20", "--hang-file", str(hang_file)])
    ctx.finish()
    return ctx.result(_hang_time(hang_file))


def _hang_time(path: Path) -> float | None:
    lines = path.read_text().splitlines() if path.exists() else []
    return next((float(line.split()[2]) for line in lines if line.startswith("hang ")), None)


def monitor_killed(ctx: Ctx) -> Run:
    """NVRx users report killed monitors go unnoticed (nvrx#182); here the round restarts with a new one."""
    ready = ctx.tmp / "ready"
    agent = ctx.mbr([*STANDALONE, "--max-restarts", "1", "--section-timeouts", "step:none", FT_WORKER, "--steps",
                     "30", "--step-time", "0.1", "--ready-file", str(ready)])
    ctx.wait_lines(ready, 2)
    monitors = [p for p in descendants(agent.pid) if "mbr_launch.monitor.server" in cmdline(p)]
    if len(monitors) != 1:
        raise ScenarioError(f"expected one rank monitor, found {monitors}")
    t_fault = time.time()
    os.kill(monitors[0], signal.SIGKILL)
    ctx.finish()
    return ctx.result(t_fault, ready=_pairs(ready))


def check_monitor(run: Run) -> None:
    assert "rank monitor process died" in run.stderr[0], run.tail()
    assert [e["event"] for e in run.events[0]].count("monitor_lost") == 1
    assert run.info["ready"] == [(0, 0), (0, 1), (1, 0), (1, 1)], run.info["ready"]


def all_ranks_sigkill(ctx: Ctx) -> Run:
    """Every rank SIGKILLed at the same moment (an OOM kill of the whole node's job, say): back to back from here,
    as ``two_failures`` does, so that both are dead before the agent can act on the first (ranks that killed
    themselves after a collective did not always: on a loaded machine the agent stopped the second first)."""
    return _killed_back_to_back(ctx, 2, (0, 1))


def one_restart(run: Run, failed: dict[int, object]) -> None:
    """However many ranks failed at once, the job restarted once; ``failed``: rank -> how its round-0 worker
    ended (a signal name or an exit code)."""
    restarts = [e for e in run.events[0] if e["event"] == "restart"]
    assert len(restarts) == 1 and restarts[0]["restart_count"] == 1, restarts
    ended = {e["rank"]: e["signal"] or e["exit_code"] for e in run.events[0]
             if e["event"] == "worker_exit" and e["round"] == 0}
    assert all(ended.get(rank) == how for rank, how in failed.items()), ended
    blamed = {e["rank"] for e in run.events[0] if e["event"] == "failure"}
    assert blamed and blamed <= set(failed), blamed


def check_all_ranks(run: Run) -> None:
    one_restart(run, {0: "SIGKILL", 1: "SIGKILL"})


def check_two_failures(run: Run) -> None:
    one_restart(run, {0: "SIGKILL", 2: "SIGKILL"})


def sleepers(ctx: Ctx, nproc: int, max_restarts: int, *script: str, extra: tuple[str, ...] = ()) -> Run:
    """Workers without collectives (tests/scripts/sleeper.py), warm standbys of the interpreter level (the
    standby hand-over is exercised without importing torch). The fault time is the first ready line (the
    crashes come --crash-after seconds after it)."""
    ready = ctx.tmp / "ready"
    ctx.mbr(["--standalone", "--nproc-per-node", str(nproc), "--max-restarts", str(max_restarts), "--standby",
             "interpreter", *extra, SLEEPER, "--ready-file", str(ready), *script])
    ctx.finish()
    lines = [line.split() for line in (ready.read_text().splitlines() if ready.exists() else [])]
    crash_after = float(script[script.index("--crash-after") + 1]) if "--crash-after" in script else 0.5
    first = min((float(t) for _r, n, _p, t in lines if n == "0"), default=None)
    return ctx.result(None if first is None else first + crash_after,
                      ready=sorted((int(r), int(n)) for r, n, _p, _t in lines))


def two_failures(ctx: Ctx) -> Run:
    """Ranks 0 and 2 of 3 are SIGKILLed back to back (microseconds apart: whatever the load, both are dead
    before the agent can act on the first; workers that exit on their own cue cannot promise that)."""
    return _killed_back_to_back(ctx, 3, (0, 2))


def _killed_back_to_back(ctx: Ctx, nproc: int, ranks: tuple[int, ...]) -> Run:
    ready = ctx.tmp / "ready"
    agent = ctx.mbr(["--standalone", "--nproc-per-node", str(nproc), "--max-restarts", "1", "--standby",
                     "interpreter", SLEEPER, "--ready-file", str(ready), "--run-seconds", "3"])
    ctx.wait_lines(ready, nproc)
    pids = agent.worker_pids()
    t_fault = time.time()
    for rank in ranks:
        os.kill(pids[rank], signal.SIGKILL)
    ctx.finish()
    return ctx.result(t_fault)


def failure_during_restart(ctx: Ctx) -> Run:
    """Rank 1 fails; in the restarted round rank 0 fails as it starts (before any step); then the job runs."""
    return sleepers(ctx, 2, 2, "--crash", "1:0,0:1", "--crash-after", "0.3", "--run-seconds", "2",
                    extra=("--restart-backoff", "0.2"))


def check_failure_during_restart(run: Run) -> None:
    failures = [(e["round"], e["rank"]) for e in run.events[0] if e["event"] == "failure"]
    assert failures == [(0, 1), (1, 0)], failures
    assert [e["restart_count"] for e in run.events[0] if e["event"] == "restart"] == [1, 2]
    assert run.info["ready"] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)], run.info["ready"]


def crash_loop(ctx: Ctx) -> Run:
    return sleepers(ctx, 1, 3, "--crash", "0:0,0:1,0:2,0:3", "--crash-after", "0", extra=("--restart-backoff", "0.5"))


def check_backoff(run: Run) -> None:
    events = run.events[0]
    backoffs = [e["backoff"] for e in events if e["event"] == "restart"]
    assert backoffs == [0.0, 0.5, 1.0], backoffs
    starts = [e["t"] for e in events if e["event"] == "rendezvous"]
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert gaps[1] >= 0.5 and gaps[2] >= 1.0, gaps


# ---- the same faults under torchrun (the bench puts its outcome beside ours) ----------------------------

TORCHRUN = [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "--max-restarts", "1"]
TORCHRUN_LIMIT = 60.0  # a torchrun still running this long after the fault is reported hung and killed


def torchrun_train(*script: str) -> Callable[[Ctx], Run]:
    def scenario(ctx: Ctx) -> Run:
        ready, fault = ctx.tmp / "ready", ctx.tmp / "fault"
        agent = ctx.command([*TORCHRUN, TRAIN, *script, "--ready-file", str(ready), "--fault-file", str(fault)],
                            name="torchrun")
        hung = not ctx.wait_exit(agent, TORCHRUN_LIMIT + 30)
        times = [float(line.split()[2]) for line in (fault.read_text().splitlines() if fault.exists() else [])]
        return ctx.result(min(times, default=None), hung=hung, ready=_pairs(ready) if ready.exists() else [])
    return scenario


def torchrun_hang(scenario_name: str) -> Callable[[Ctx], Run]:
    """tests/scripts/hangs.py's fault (torchrun has no rank monitor for ft_worker.py's NVRx client to use)."""
    def scenario(ctx: Ctx) -> Run:
        hang_file = ctx.tmp / "hang"
        agent = ctx.command([*TORCHRUN, HANGS, "--scenario", scenario_name, "--culprit", "1", "--hang-step", "20",
                             "--hang-file", str(hang_file)], name="torchrun")
        ctx.wait_lines(hang_file, 1, 90)
        hung = not ctx.wait_exit(agent, TORCHRUN_LIMIT)
        return ctx.result(_hang_time(hang_file), hung=hung)
    return scenario
