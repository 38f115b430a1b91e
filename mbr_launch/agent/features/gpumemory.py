"""Between rounds, on the workers' GPUs (``--ft-gpu-memory-reclaim-timeout``): wait for the memory the stopped
round's processes still hold, name what strangers hold, and keep a node out whose strangers leave less memory
free than its ranks used in the last round (the next round would run out of it).

    first join --> open NVML once (for the agent's life), note the pids already on the GPUs
    a stop begins --> note what the round's live workers hold on each GPU (NVML's per-process view)
    round stopped --> wait (health.gpumem) --> short of memory because of strangers: the node stays out
                                           \\-> otherwise: one line (back after, or not back) naming strangers
"""

from __future__ import annotations

import os
import time
from typing import Callable, Mapping, Sequence

from mbr_launch.agent.context import Context
from mbr_launch.config.model import LaunchConfig
from mbr_launch.health import gpumem, gpuowners
from mbr_launch.health.gpuowners import Job, Owner, Reading
from mbr_launch.health.nvml import Nvml, Session
from mbr_launch.workers import strays
from mbr_launch.workers.process import Worker

NvmlOpener = Callable[[], "Session | str"]
EVENT_HOLDERS = 20  # processes listed in a gpu_memory event


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

    # ---- NVML -------------------------------------------------------------------------------------

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

    # ---- around a round ---------------------------------------------------------------------------

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
