"""GPUs through NVML: how many the job may use vs --nproc-per-node, memory health, recovery actions, and
processes of others on the job's GPUs. NVML ignores CUDA_VISIBLE_DEVICES: the count honours it.
"""

from __future__ import annotations

import os

from mbr_launch.doctor.context import DoctorContext
from mbr_launch.doctor.probes import NvmlView
from mbr_launch.doctor.registry import Finding, check, check_with, error, ok, skip, warn
from mbr_launch.health import gpumem
from mbr_launch.health.gpuowners import Job, Owner, strangers_line


def _gpus(ctx: DoctorContext) -> NvmlView | Finding:
    """NVML's view of this host's GPUs, or the skip of a check that needs some."""
    view = ctx.nvml()
    return view if view.available and view.gpus else skip(f"no GPU ({view.reason or 'NVML reports none'})")


@check("gpu.count", "GPUs vs --nproc-per-node")
def count(ctx: DoctorContext) -> Finding:
    nproc = ctx.nproc_per_node.strip().lower()
    if nproc == "cpu":
        return ok("--nproc-per-node cpu: workers do not use GPUs")
    if isinstance(view := _gpus(ctx), Finding):
        return view
    n = len(gpumem.devices(ctx.env, len(view.gpus)))  # the GPUs CUDA_VISIBLE_DEVICES leaves to the job
    cvd = ctx.env.get("CUDA_VISIBLE_DEVICES")
    saw = f"{len(view.gpus)} GPU(s)" + (f", CUDA_VISIBLE_DEVICES={cvd!r}" if cvd is not None else "")
    if nproc in ("gpu", "auto"):
        if n == 0:
            return error(f"{saw}: none visible for --nproc-per-node {nproc}", "fix CUDA_VISIBLE_DEVICES")
        return ok(f"{saw}; --nproc-per-node {nproc} starts {n} worker(s)")
    try:
        want = int(nproc)
    except ValueError:
        return error(f"--nproc-per-node {ctx.nproc_per_node!r} is not a number, gpu, cpu or auto",
                     "pass --nproc-per-node N or gpu")
    if want > n:
        return error(f"{saw} visible but --nproc-per-node {want}: ranks would share or lack GPUs",
                     f"use --nproc-per-node {n} (or gpu), or make more GPUs visible")
    if want < n:
        return warn(f"{saw} visible, --nproc-per-node {want}: {n - want} GPU(s) idle",
                    f"use --nproc-per-node {n} (or gpu), or hide the spare GPUs with CUDA_VISIBLE_DEVICES")
    return ok(f"{saw}, one per worker")


@check_with(_gpus, "gpu.memory", "GPU memory health: ECC errors, retired pages, row remapping")
def memory(view: NvmlView, ctx: DoctorContext) -> Finding:
    errors, warnings = [], []
    for g in view.gpus:
        tag = f"GPU{g.index} ({g.name})"
        if g.remap_failure:
            errors.append(f"{tag}: row remapping failed")
        if g.remap_pending or g.retired_pending:
            warnings.append(f"{tag}: {'row remap' if g.remap_pending else 'page retirement'} pending a GPU reset")
        if g.ecc_uncorrected:
            warnings.append(f"{tag}: {g.ecc_uncorrected} uncorrectable ECC error(s) since driver load")
    if errors:
        return error("; ".join(errors + warnings),
                     "drain this node and have the GPU replaced (row remapping failure is permanent)")
    if warnings:
        return warn("; ".join(warnings), "drain the node and reset the GPU (`nvidia-smi -r -i <index>`) before training")
    return ok(f"{len(view.gpus)} GPU(s): no pending retirement/remapping, no uncorrectable ECC errors")


@check_with(_gpus, "gpu.recovery", "GPU recovery action pending (NVML)")
def recovery(view: NvmlView, ctx: DoctorContext) -> Finding:
    pending = [(g.index, g.recovery_action) for g in view.gpus if g.recovery_action not in (None, "none")]
    known = [g for g in view.gpus if g.recovery_action is not None]
    if pending:
        listed = ", ".join(f"GPU{i}: {a}" for i, a in pending)
        return error(f"NVML asks for recovery: {listed}",
                     "drain the node and perform the action (gpu_reset: `nvidia-smi -r`; node_reboot: reboot)")
    if not known:
        return skip(f"driver {view.driver or '?'} does not report recovery actions")
    return ok(f"{len(known)} GPU(s): no recovery action pending")


@check("gpu.strangers", "Processes of others on the job's GPUs", named=True)
def strangers(ctx: DoctorContext) -> Finding:
    """Name another job's processes on the workers' GPUs (a worker an earlier run left spinning) before the
    launch: they take memory and compute, and a reclaim wait waits for them in vain."""
    nproc = ctx.nproc_per_node.strip().lower()
    if nproc == "cpu":
        return ok("--nproc-per-node cpu: workers do not use GPUs")
    if nproc.isdigit():
        count = int(nproc)
    elif isinstance(view := _gpus(ctx), Finding):
        return view
    else:
        count = len(view.gpus)
    devices = gpumem.devices(ctx.env, count)
    if not devices:
        return skip("no GPU is visible (CUDA_VISIBLE_DEVICES)")
    memories = ctx.gpu_memory(devices)
    if isinstance(memories, str):
        return skip(f"no GPU ({memories})")
    # Before the first round every process on the GPUs was there before it: one not seen is a stranger's.
    present = frozenset(p.pid for m in memories for p in m.processes or ())
    reading = ctx.gpu_owners(memories, Job(me=os.getpid(), run_id=ctx.run_id, present_before=present))
    others = reading.of(Owner.STRANGER)
    listed = [m.device for m in memories if m.processes is not None]
    if others:
        return warn(strangers_line(others),
                    "they share these GPUs' memory and compute with the job: stop them (`kill PID`) if an earlier "
                    "run left them behind, or give the job other GPUs (CUDA_VISIBLE_DEVICES)")
    if not listed:
        return skip("NVML lists no processes on these GPUs here")
    return ok(f"no process of others on GPU {', '.join(listed)}")
