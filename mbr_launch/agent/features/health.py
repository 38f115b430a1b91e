"""What a node does before it joins a round (ft_launcher 0.6/0.7's checks; they live in ``health``):

    first join --> open NVML (``GpuGate``, for the agent's life), note the pids already on the GPUs
    a stop begins --> note what the round's live workers hold on each GPU (NVML's per-process view)
    round stopped --> leftovers (--ft-check-remaining-processes) --> GPU memory (--ft-gpu-memory-reclaim-timeout):
                      wait for it (health.gpumem); strangers leave less free than the round used: stay out, as below
    first join, or after the above --> checks --> all passed: join
                                              \\-> one failed: one FAILURE line, a health_check event, exit 7;
                                                   after a round: abort the fast path and leave the rendezvous,
                                                   so that the others go on without this node (MIN allowing)
"""

from __future__ import annotations

import os
import time
from typing import Callable, Collection, Mapping, Sequence

from mbr_launch.agent.context import Context, Feature
from mbr_launch.agent.ending import finish
from mbr_launch.agent.messages import Departure
from mbr_launch.cluster import fastround
from mbr_launch.cluster.round import Round
from mbr_launch.config.model import LaunchConfig
from mbr_launch.health import gpumem, gpuowners, leftovers, suite
from mbr_launch.health.checks import NODE_HEALTH
from mbr_launch.health.gpuowners import Job, Owner, Reading
from mbr_launch.health.nvml import Nvml, Session
from mbr_launch.health.result import CheckResult
from mbr_launch.report import exitcodes
from mbr_launch.workers import strays
from mbr_launch.workers.process import Worker

GPU_MEMORY = "gpu_memory"
NvmlOpener = Callable[[], "Session | str"]
EVENT_HOLDERS = 20  # processes listed in a gpu_memory event


def wanted(cfg: LaunchConfig) -> bool:
    spec = cfg.nvrx
    return suite.configured(spec) or spec.check_remaining_processes or spec.gpu_memory_reclaim_timeout > 0


class HealthGate(Feature):
    def __init__(self, cfg: LaunchConfig, environ: Mapping[str, str], *, own_pids: Callable[[], Collection[int]],
                 read: suite.Readers = suite.Readers(), gpu: NvmlOpener = Nvml.open,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._spec, self._cfg, self._environ = cfg.nvrx, cfg, environ
        self._own_pids = own_pids  # what the agent started and holds (standbys, the rank monitor): not leftovers
        self._read, self._clock = read, clock
        self._baseline = suite.nic_baseline(self._spec, read)  # at the agent's start, as NVRx takes it
        self._noted: set[str] = set()  # skips already said once
        self._gpu = GpuGate(cfg, environ, open_nvml=gpu, clock=clock) if self._spec.gpu_memory_reclaim_timeout > 0 \
            else None

    def before_join(self, ctx: Context, previous: Round | None) -> int | None:
        """None: join (or a signal came: the join sees it). Otherwise the exit code, this node staying out."""
        index = ctx.round.index + 1 if ctx.round else 0
        if previous is None and self._gpu:
            self._gpu.first_join(ctx)
        if previous is not None:
            if self._spec.check_remaining_processes:
                self.report_leftovers(ctx, previous)
            short = self._gpu.after_stop(ctx, index) if self._gpu else None
            if ctx.wakeup.pending_signal() is not None:
                return None
            if short is not None:
                return self._stay_out(ctx, previous, CheckResult.failed(GPU_MEMORY, short))
        if not suite.configured(self._spec):
            return None
        began = self._clock()
        results = suite.run_checks(self._spec, self._environ, self._baseline, self._read)
        failed = next((r for r in results if not r.ok), None)
        for result in results:
            if result.skipped and result.name == NODE_HEALTH and result.name not in self._noted:
                self._noted.add(result.name)  # asked for by name, and not there: say so once
                ctx.say(f"health check {result.name} skipped: {result.detail}")
        if failed is not None or not all(r.skipped for r in results):
            ctx.log.emit("health_check", round=index, ok=failed is None, failed=failed.name if failed else None,
                         detail=failed.detail if failed else None, seconds=round(self._clock() - began, 3),
                         checks=[{"name": r.name, "ok": r.ok, "skipped": r.skipped, "detail": r.detail} for r in results])
        return None if failed is None else self._stay_out(ctx, previous, failed)

    def _stay_out(self, ctx: Context, previous: Round | None, failed: CheckResult) -> int:
        reason = f"health check {failed.name} failed: {failed.detail}"
        store = ""
        if previous is not None:
            ctx.departure = Departure.LEAVE  # the others go on without this node
            store = self._abort_fast_path(ctx, previous, reason)
        else:
            ctx.departure = Departure.NONE  # never joined: nothing to leave
        ctx.say(f"FAILURE: {reason}; this node does not join the rendezvous (exit {exitcodes.UNHEALTHY}){store}")
        return finish(ctx, exitcodes.UNHEALTHY, reason)

    def _abort_fast_path(self, ctx: Context, previous: Round, reason: str) -> str:
        """Send the previous round's other agents to the full join; a note when this node hosts the store."""
        try:
            with ctx.store_call("telling the other nodes this one stays out"):
                if self._cfg.rendezvous.backend == "c10d":
                    fastround.abort(previous.control, f"node {ctx.node} stays out: {reason}",
                                    token=previous.token, nodes=previous.group_world_size)
                hosting = ctx.cluster.hosts_store(previous)
        except Exception:  # the store is gone: the others see this node lost
            return ""
        return "; it serves the rendezvous store, so the other nodes lose it too" if hosting else ""

    def report_leftovers(self, ctx: Context, previous: Round) -> None:
        found = leftovers.find(strays.process_table(), me=os.getpid(), workers=[w.pid for w in ctx.group.workers],
                               keep=self._own_pids(), environ_of=leftovers.environ_of,
                               marks=leftovers.markers(self._cfg.rendezvous.run_id, previous.master_port,
                                                       previous.group_rank))
        if not found:
            return
        found = leftovers.with_cmdlines(found)
        ctx.log.emit("leftovers", round=previous.index, count=len(found),
                     processes=[f.to_event() for f in found[:leftovers.EVENT_MAX]])
        ctx.say(leftovers.line(found, previous.index))


# ---- GPU memory between rounds ------------------------------------------------------------------

class GpuGate:
    def __init__(self, cfg: LaunchConfig, environ: Mapping[str, str], *, open_nvml: NvmlOpener = Nvml.open,
                 clock: Callable[[], float] = time.monotonic,
                 table: Callable[[], Mapping[int, strays.Proc]] = strays.process_table,
                 seen: Callable[[int], gpuowners.ProcInfo | None] = gpuowners.seen) -> None:
        self._spec, self._run_id = cfg.nvrx, cfg.rendezvous.run_id
        self._devices = gpumem.devices(environ, cfg.workers.nproc_per_node)
        self._open, self._clock, self._table, self._seen = open_nvml, clock, table, seen
        self._session: Session | str | None = None  # opened at the first join, kept: no init on a stop's path
        self._present: frozenset[int] = frozenset()  # pids on the GPUs before the coming round began
        self._used: dict[str, float] = {}  # MB the job's workers held per GPU in the last round, where seen
        self._skip_said = False

    def _nvml(self) -> Session | str:
        if self._session is None:
            self._session = self._open() if self._devices else "no GPU is visible (CUDA_VISIBLE_DEVICES)"
        return self._session

    def _read(self, job: Job) -> Reading:
        session = self._nvml()
        assert not isinstance(session, str)
        memories = [session.memory(d) for d in self._devices]
        others = any(p.pid not in job.ended for m in memories for p in m.processes or ())
        return gpuowners.classify(memories, job, self._table() if others else {}, self._seen)

    def _job(self, ended: Sequence[int] = ()) -> Job:
        return Job(me=os.getpid(), run_id=self._run_id, ended=frozenset(ended), present_before=self._present)

    def first_join(self, ctx: Context) -> None:
        """Before the first round: open NVML, note who is on the GPUs, and hook the group's stops."""
        if isinstance(self._nvml(), str):
            return
        self._present = frozenset(h.pid for h in self._read(self._job()).holders)
        ctx.group.before_stop = self.note_stop

    def note_stop(self, workers: Sequence[Worker]) -> None:
        """A stop is about to signal ``workers``: what they hold now is what the round used."""
        alive = [w.pid for w in workers if w.alive]
        if not alive or isinstance(self._nvml(), str):
            return
        try:
            held = gpumem.held_by_job(self._read(self._job()), alive)
        except Exception:  # never let a reading break a stop
            return
        for device, mb in held.items():
            self._used[device] = max(mb, self._used.get(device, 0.0))

    def after_stop(self, ctx: Context, index: int) -> str | None:
        """Wait for the stopped round's memory; why this node must stay out, or None."""
        spec, session = self._spec, self._nvml()
        if isinstance(session, str):
            if not self._skip_said:
                self._skip_said = True
                ctx.log.emit("gpu_memory", round=index, reclaimed=None, seconds=0.0, polls=0, used_mb={},
                             tolerance_mb=spec.gpu_memory_tolerance_mb, timeout=spec.gpu_memory_reclaim_timeout,
                             skipped=session, held_by=[])
                ctx.say(f"GPU memory reclaim wait skipped: {session}")
            return None
        job = self._job([w.pid for w in ctx.group.workers if not w.alive])
        first: list[Reading] = []

        def read() -> Reading:
            reading = self._read(job)
            if not first:  # what the stopped workers still held when the wait began
                first.append(reading)
            return reading

        got = gpumem.wait_reclaimed(read, timeout=spec.gpu_memory_reclaim_timeout,
                                    tolerance_mb=spec.gpu_memory_tolerance_mb, poll_interval=spec.gpu_memory_poll_interval,
                                    clock=self._clock, sleep=ctx.wakeup.sleep)
        for device, mb in gpumem.held_by_job(first[0], sorted(job.ended)).items():
            self._used[device] = max(mb, self._used.get(device, 0.0))
        short = gpumem.short_of(got.last, self._used)
        ctx.log.emit("gpu_memory", round=index, reclaimed=got.reclaimed, seconds=round(got.seconds, 3), polls=got.polls,
                     used_mb={m.device: m.used_mb for m in got.last.memories}, tolerance_mb=spec.gpu_memory_tolerance_mb,
                     timeout=spec.gpu_memory_reclaim_timeout, skipped=None,
                     held_by=[h.to_event() for h in got.last.holders[:EVENT_HOLDERS]],
                     short=[{"gpu": m.device, "free_mb": round(free), "needed_mb": round(need)} for m, free, need in short])
        self._present = frozenset(h.pid for h in got.last.holders)
        self._used = {}  # the next round's workers are measured afresh
        if got.interrupted:
            return None
        strangers = got.last.of(Owner.STRANGER)
        if short:
            memory, free, need = short[0]
            return (f"GPU {memory.device} has {free:.0f} MB free for the next round, and this job's workers used "
                    f"{need:.0f} MB there in the last round; held by others: {gpuowners.strangers_line(strangers)}")
        others = f"; not waited for: {gpuowners.strangers_line(strangers)}" if strangers else ""
        if not got.reclaimed:
            ctx.say(f"WARNING: GPU memory not back within {spec.gpu_memory_reclaim_timeout:g} s "
                    f"({_waited_for(got)}): starting the next round anyway{others}")
        elif got.polls > 1 or strangers:
            took = f"{got.seconds:.2f}" if got.seconds < 1 else f"{got.seconds:.1f}"
            ctx.say(f"GPU memory of the stopped workers back after {took} s{others}")
        return None


def _waited_for(got: gpumem.Reclaim) -> str:
    parts = [h.describe() for h in got.holding()]
    over = got.over()
    if over:
        parts.append(f"{gpumem.describe(over)} in use, no per-process view; tolerance {got.tolerance_mb:g} MB")
    return "; ".join(parts) or "?"
