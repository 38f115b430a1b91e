"""What a node does before it joins a round (ft_launcher 0.6/0.7's checks; they live in ``health``):

    round stopped --> leftovers (--ft-check-remaining-processes) --> GPU memory (--ft-gpu-memory-reclaim-timeout,
                      ``agent.features.gpumemory``; strangers leave too little memory free: stay out, as below)
    first join, or after the above --> checks --> all passed: join
                                              \\-> one failed: one FAILURE line, a health_check event, exit 7;
                                                   after a round: abort the fast path and leave the rendezvous,
                                                   so that the others go on without this node (MIN allowing)
"""

from __future__ import annotations

import os
import time
from typing import Callable, Collection, Mapping

from mbr_launch.agent.context import Context, Feature
from mbr_launch.agent.ending import finish
from mbr_launch.agent.features.gpumemory import GpuGate, NvmlOpener
from mbr_launch.agent.messages import Departure
from mbr_launch.cluster import fastround
from mbr_launch.cluster.round import Round
from mbr_launch.config.model import LaunchConfig
from mbr_launch.health import leftovers, suite
from mbr_launch.health.checks import NODE_HEALTH
from mbr_launch.health.nvml import Nvml
from mbr_launch.health.result import CheckResult
from mbr_launch.report import exitcodes
from mbr_launch.workers import strays

GPU_MEMORY = "gpu_memory"


def wanted(cfg: LaunchConfig) -> bool:
    """Whether this launch asked for anything the gate does."""
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

    # ---- between rounds ---------------------------------------------------------------------------

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
