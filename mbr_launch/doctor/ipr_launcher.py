"""In-process restart against the launcher around it: who restarts what (``any-failed`` restarts every rank for
one dead process), and the ports the Wrapper needs (``MASTER_PORT`` +1 and +2). At warn at most: a launch that
ignores them still runs (docs/in-process-restart.md).
"""

from __future__ import annotations

from mbr_launch.decide.policy import When
from mbr_launch.config.build import C10D_PORT, STATIC_PORT
from mbr_launch.config.parse import parse_nnodes
from mbr_launch.doctor.context import DoctorContext
from mbr_launch.doctor.launcher import FT_LAUNCHERS, is_local_host, split_endpoint
from mbr_launch.doctor.registry import Finding, check, info, ok, skip, warn

_NOT_ON = ("no sign of in-process restart (config, --inprocess-restart, or a script using "
           "nvidia_resiliency_ext.inprocess)")
MIN_HEALTHY = When.MIN_HEALTHY  # the launcher's --ft-restart-policy, as text or as When: the two compare equal


@check("ipr.restart_policy", "in-process restart: the launcher restarts only when too few nodes stay healthy")
def restart_policy(ctx: DoctorContext) -> Finding:
    why = ctx.ipr_signal
    if why is None:
        return skip(_NOT_ON)
    if ctx.launcher == "torchrun":
        return warn(f"{why}, but torchrun stops every worker when one exits: the Wrapper can only recover "
                    "faults that leave every process alive",
                    "launch with mbr-launch --ft-restart-policy min-healthy --nnodes MIN:MAX (same flags as torchrun)")
    if ctx.launcher not in FT_LAUNCHERS:
        return skip(f"{why}; started by {ctx.launcher}, no in-job restarting launcher: restarts are the Wrapper's")
    if ctx.restart_policy != MIN_HEALTHY:
        return warn(f"{why}, with --ft-restart-policy {ctx.restart_policy}: one process that exits restarts every "
                    "rank of the job, also when the Wrapper would have carried on without it (NVRx does not "
                    "support any-failed with in-process restart)",
                    f"add --ft-restart-policy {MIN_HEALTHY} and give --nnodes as MIN:MAX")
    low, high = parse_nnodes(ctx.nnodes)
    if low == high:
        return info(f"{why}; {MIN_HEALTHY} with --nnodes {ctx.nnodes}: the first node that loses a rank leaves fewer "
                    f"than {low} healthy nodes, so the job restarts as with any-failed",
                    f"give a range, e.g. --nnodes {max(1, low - 1)}:{high}, matching how many nodes the Wrapper's "
                    "rank assignment can continue with")
    return ok(f"{why}; {MIN_HEALTHY}: the job restarts only when fewer than {low} of {high} nodes have all "
              "their ranks alive")


def _master_port(ctx: DoctorContext) -> tuple[str, int] | None:
    """(host, port) the workers' MASTER_PORT is on when the launcher fixes it in advance (static: --master-port;
    torchrun's c10d: its store's endpoint), else None."""
    if ctx.rdzv_backend == "static" and not ctx.standalone:
        return ctx.master_addr or "127.0.0.1", ctx.master_port or STATIC_PORT
    if ctx.launcher == "torchrun" and ctx.rdzv_endpoint and not ctx.standalone:
        return split_endpoint(ctx.rdzv_endpoint, C10D_PORT)
    return None


@check("ipr.ports", "in-process restart: MASTER_PORT+1 and +2 free (application and Wrapper stores)")
def ports(ctx: DoctorContext) -> Finding:
    if ctx.ipr_signal is None:
        return skip(_NOT_ON)
    static = ctx.rdzv_backend == "static" and not ctx.standalone
    if ctx.launcher == "mbr-launch" and not static:  # static: the workers' MASTER_PORT is --master-port, as torchrun's
        return ok("mbr-launch picks each round's MASTER_PORT with MASTER_PORT+1 and +2 free")
    try:
        fixed = _master_port(ctx)
    except ValueError:
        return skip("rendezvous endpoint invalid (see rdzv.endpoint)")
    if fixed is None:
        return info(f"{ctx.launcher} picks MASTER_PORT at each start without keeping MASTER_PORT+1 and +2 free",
                    "launch with mbr-launch, whose fresh MASTER_PORT keeps both free")
    host, port = fixed
    if not is_local_host(ctx, host):
        return skip(f"MASTER_PORT {port} is on {host}, not this node")
    taken = [p for p in (port + 1, port + 2) if not ctx.port_free(host, p)]
    if not taken:
        return ok(f"MASTER_PORT {port}: {port + 1} and {port + 2} are free")
    return warn(f"MASTER_PORT {port}, and {', '.join(map(str, taken))} on this node is already in use: the "
                "application's store (+1) or the Wrapper's (+2) cannot bind it",
                f"stop what listens there (`ss -ltnp 'sport = :{taken[0]}'`), choose another port, or launch with "
                "mbr-launch on a c10d rendezvous, which picks a free MASTER_PORT each round")
