"""torch's private rendezvous parts that mbr-launch patches for its restart speed-ups.

A torch that renamed or dropped one of them still launches (that patch does not install and torch's own
behaviour stands), but restarts get slower and nothing else would say so: the agent says it in one line at
start-up, and this check says it before a launch (``cluster.torch_internals`` has the patches).
"""

from __future__ import annotations

from mbr_launch.cluster.torch_internals import lost_line
from mbr_launch.doctor.context import DoctorContext
from mbr_launch.doctor.registry import Finding, check, ok, skip, warn


@check("versions.torch_internals", "torch's private rendezvous parts that the restart speed-ups patch")
def torch_internals(ctx: DoctorContext) -> Finding:
    if ctx.rdzv_backend != "c10d":
        return skip(f"the {ctx.rdzv_backend} rendezvous patches none of them")
    version = ctx.versions().torch
    if version is None:
        return skip("torch cannot be imported (see versions.torch)")
    patches = ctx.torch_patches()
    lost = lost_line(patches, version)
    if lost is None:
        return ok(f"torch {version}: all {len(patches)} install ({', '.join(p.name for p in patches)})")
    return warn(lost, "the launch works without them, only slower to restart: use a torch whose internals "
                      "mbr-launch knows (the one it was tested with), or report this torch to its maintainers")
