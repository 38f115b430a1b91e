"""Who launches the job, and how: torchrun vs a fault-tolerant launcher, srun's kill-on-bad-exit,
launchers per node, and the ``GROUP_RANK`` NVRx uses as the infrastructure (node) rank off Slurm.
"""

from __future__ import annotations


from mbr_launch.config.build import C10D_PORT, STATIC_PORT
from mbr_launch.doctor.context import DoctorContext
from mbr_launch.doctor.neighbours import conflicts, rendezvous_key, split_endpoint
from mbr_launch.config.slurm import SlurmError, parse_tasks_per_node
from mbr_launch.doctor.registry import Finding, check, error, info, ok, skip, warn
from mbr_launch.report.redact import shown_argv
from mbr_launch.visible import one_line

FT_LAUNCHERS = {"mbr-launch", "ft_launcher"}
# Launchers that start one agent per node which then spawns --nproc-per-node workers.
AGENT_LAUNCHERS = FT_LAUNCHERS | {"torchrun"}


@check("launcher.torchrun", "fault tolerance needs mbr-launch or ft_launcher, not torchrun")
def torchrun(ctx: DoctorContext) -> Finding:
    who = ctx.launcher
    if who in FT_LAUNCHERS:
        return ok(f"started by {who}")
    if not ctx.ft_declared:
        return ok(f"started by {who}; no fault tolerance declared")
    return error(
        f"fault tolerance is configured but the job is started by {who}: "
        + ("torchrun ignores it and silently runs without hang detection or restarts" if who == "torchrun"
           else "nothing hosts the rank monitors, so fault tolerance is silently off"),
        "launch with mbr-launch (same flags as torchrun), e.g. `mbr-launch --nproc-per-node 8 train.py`",
    )


@check("launcher.srun_kill_on_bad_exit", "srun --kill-on-bad-exit=0 when restarts are on")
def kill_on_bad_exit(ctx: DoctorContext) -> Finding:
    env = ctx.env
    if "SLURM_STEP_ID" not in env:
        return skip("not inside an srun step")
    if ctx.ipr is None and not ctx.ft_declared:
        return ok("no in-process restart or fault tolerance: srun may kill the step on a bad exit")
    value = env.get("SLURM_KILL_BAD_EXIT")
    what = "in-process restart" if ctx.ipr else "fault tolerance"
    fix = ("start the step with `srun --kill-on-bad-exit=0 ...`, or `export SLURM_KILL_BAD_EXIT=0` before srun "
           "(srun reads it and tasks inherit it, so doctor can verify it)")
    if value is not None and value.strip() == "0":
        return ok("SLURM_KILL_BAD_EXIT=0")
    if value is not None and value.strip() != "0":
        saw = f"SLURM_KILL_BAD_EXIT={value}: srun kills every task when one exits non-zero, defeating {what}"
        return error(saw, fix) if ctx.ipr else warn(saw, fix)
    # srun does not export the flag to tasks; say how to verify instead of guessing.
    saw = ("srun's kill-on-bad-exit setting is not visible to tasks (SLURM_KILL_BAD_EXIT unset); "
           "the default comes from slurm.conf KillOnBadExit (check `scontrol show config | grep KillOnBadExit`)")
    return warn(saw, fix) if ctx.ipr else info(saw, fix)


def tasks_per_node(spec: str, node_id: str | None = None) -> int:
    """Tasks on this node (SLURM_NODEID) from Slurm's compressed list, e.g. "2(x3),1"; the most on any node
    when the node id is unknown."""
    try:
        counts = parse_tasks_per_node(spec)
    except SlurmError as exc:
        raise ValueError(str(exc)) from None
    if node_id is not None and node_id.isdigit() and int(node_id) < len(counts):
        return counts[int(node_id)]
    return max(counts)


@check("launcher.per_node", "one launcher per node")
def per_node(ctx: DoctorContext) -> Finding:
    env = ctx.env
    if ctx.launcher not in AGENT_LAUNCHERS:
        return ok(f"ranks started directly by {ctx.launcher}; one task per GPU is expected")
    fix_srun = "start one launcher per node: `srun --ntasks-per-node=1 mbr-launch --nproc-per-node <gpus> ...`"
    if "SLURM_STEP_ID" in env:
        spec = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_NTASKS_PER_NODE")
        if spec:
            try:
                n = tasks_per_node(spec, env.get("SLURM_NODEID"))
            except ValueError as exc:
                return warn(str(exc), "report this Slurm value to the mbr-launch maintainers")
            if n > 1:
                return error(f"{n} launchers per node in this srun step (tasks per node {spec}): each would start "
                             f"--nproc-per-node={ctx.nproc_per_node} workers on the same GPUs", fix_srun)
            return ok(f"one launcher per node (tasks per node {spec})")
    elif "SLURM_JOB_ID" in env and (spec := env.get("SLURM_NTASKS_PER_NODE")):
        n = tasks_per_node(spec)
        if n > 1:
            return warn(f"the allocation has {n} tasks per node; an srun without --ntasks-per-node=1 would start "
                        f"{n} launchers per node", fix_srun)
    return _neighbours(ctx)


def _neighbours(ctx: DoctorContext) -> Finding:
    view = ctx.nvml()
    has_gpus = bool(view.available and view.gpus)
    rendezvous = rendezvous_key(standalone=ctx.standalone, endpoint=ctx.rdzv_endpoint,
                                master_addr=ctx.master_addr, master_port=ctx.master_port)
    found, ignored = conflicts(ctx.other_launchers(), uid=ctx.uid, env=ctx.env, has_gpus=has_gpus,
                               rendezvous=rendezvous)
    aside = f" ({ignored} other launcher process(es) ignored: other users' jobs, --help, doctor)" if ignored else ""
    if not found:
        scope = "these GPUs or this rendezvous" if has_gpus else "this rendezvous"
        return ok(f"no other launch of yours on this host uses {scope}{aside}")
    # Without secrets (doctor's output gets pasted into issues) or control characters (the process chose them).
    listed = "; ".join(f"pid {c.process.pid} {c.why}: {one_line(shown_argv(c.process.argv)[:100])}" for c in found[:3])
    pids = " ".join(str(c.process.pid) for c in found)
    gpu_fix = "give each job its own GPUs (CUDA_VISIBLE_DEVICES=...) or " if any("GPU" in c.why for c in found) else ""
    port_fix = "use another --rdzv-endpoint port, or " if any("rendezvous" in c.why for c in found) else ""
    return warn(f"{len(found)} other launch(es) of yours on this host: {listed}",
                f"{gpu_fix}{port_fix}stop the other launch (kill {pids}) if it is left over")


@check("launcher.group_rank", "GROUP_RANK present and unique off Slurm (NVRx infrastructure rank)")
def group_rank(ctx: DoctorContext) -> Finding:
    if ctx.max_nodes <= 1:
        return ok("single node: GROUP_RANK not needed")
    if ctx.launcher == "mbr-launch":
        return ok("mbr-launch gives every worker GROUP_RANK from the rendezvous: unique per node")
    if ctx.on_slurm:
        return ok("on Slurm: NVRx takes the infrastructure rank from SLURM_PROCID")
    env = ctx.env
    fix = ("export GROUP_RANK=<this node's index 0..N-1>, different on every node "
           "(e.g. GROUP_RANK=$NODE_RANK from your scheduler)")
    raw = env.get("GROUP_RANK")
    if raw is None:
        saw = (f"multi-node job (--nnodes {ctx.nnodes}) off Slurm without GROUP_RANK: NVRx cannot assign "
               "infrastructure ranks")
        needed = ctx.ft_declared or ctx.ipr is not None
        return error(saw, fix) if needed else warn(saw, fix)
    try:
        rank = int(raw)
    except ValueError:
        return error(f"GROUP_RANK={raw!r} is not an integer", fix)
    if not 0 <= rank < ctx.max_nodes:
        return error(f"GROUP_RANK={rank} is outside 0..{ctx.max_nodes - 1} for --nnodes {ctx.nnodes}", fix)
    node_rank = env.get("NODE_RANK")
    if node_rank is not None and node_rank.strip() != raw.strip():
        return warn(f"GROUP_RANK={raw} but NODE_RANK={node_rank}: two different node indices", fix)
    if rank == 0 and (store := store_endpoint(ctx)) and not is_local_host(ctx, store[0]):
        return warn(f"GROUP_RANK=0 on a node that does not host the rendezvous ({store[0]}): is GROUP_RANK=0 set on "
                    "every node? Duplicate infrastructure ranks make NVRx fail", fix)
    return ok(f"GROUP_RANK={rank} (unique across nodes is your scheduler's job; doctor sees one node)")


def store_endpoint(ctx: DoctorContext) -> tuple[str, int] | None:
    """(host, port) the rendezvous store listens on; None when standalone or not given. May raise ValueError."""
    if ctx.standalone:
        return None
    if ctx.rdzv_endpoint:
        return split_endpoint(ctx.rdzv_endpoint, STATIC_PORT if ctx.rdzv_backend == "static" else C10D_PORT)
    if ctx.master_addr:
        return ctx.master_addr, ctx.master_port or STATIC_PORT
    return None


def is_local_host(ctx: DoctorContext, host: str) -> bool:
    addrs = ctx.resolve(host)
    return bool(addrs) and bool(set(addrs) & ctx.local_addresses())
