"""In-process restart (NVRx ``inprocess``) settings, the NCCL watchdogs against ``hard_timeout``, the torch /
NCCL versions these need, and the torch internals the restart speed-ups patch. Each fails silently at run time
(without ``NCCL_NVLS_ENABLE=0`` the restarted communicator hangs, ...): these say so before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from packaging.version import InvalidVersion, Version

from mbr_launch.cluster.torch_internals import lost_line
from mbr_launch.doctor.context import DoctorContext
from mbr_launch.doctor.registry import Finding, check, check_with, error, ok, skip, warn

if TYPE_CHECKING:  # imported by the context only where in-process restart is configured
    from mbr_launch.doctor.mbridge import InProcessRestart

IPR_MIN_TORCH = Version("2.5.1")
IPR_MIN_NCCL = Version("2.26.2")
IPR_BAD_NCCL = (Version("2.28.3"), Version("2.28.8"))  # inclusive: segfault during in-process restart
MIN_TORCH = Version("2.3")  # our own floor (pyproject)
NCCL_HEARTBEAT_DEFAULT_S = 480.0  # TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC default in ProcessGroupNCCL

_NOT_ON = "in-process restart not enabled"


def _ipr(ctx: DoctorContext) -> InProcessRestart | Finding:
    return skip(_NOT_ON) if ctx.ipr is None else ctx.ipr


def _env_check(ctx: DoctorContext, name: str, accepted: set[str], fix_value: str, broken: str) -> Finding:
    value = ctx.effective_env.get(name)
    if value is not None and value.strip().lower() in accepted:
        return ok(f"{name}={value}")
    saw = f"{name} is unset" if value is None else f"{name}={value}"
    return error(f"{saw}: {broken}", f"export {name}={fix_value} (or set it in the config's env_vars)")


@check_with(_ipr, "ipr.rethrow_cuda_errors", "in-process restart: TORCH_NCCL_RETHROW_CUDA_ERRORS=0")
def rethrow(ipr: InProcessRestart, ctx: DoctorContext) -> Finding:
    return _env_check(
        ctx, "TORCH_NCCL_RETHROW_CUDA_ERRORS", {"0"}, "0",
        "torch rethrows CUDA errors from the NCCL watchdog thread and the process dies before NVRx restarts it",
    )


@check_with(_ipr, "ipr.nvls", "in-process restart: NCCL_NVLS_ENABLE=0")
def nvls(ipr: InProcessRestart, ctx: DoctorContext) -> Finding:
    return _env_check(
        ctx, "NCCL_NVLS_ENABLE", {"0"}, "0",
        "NVLink SHARP buffers are not released on abort, so the restarted communicator hangs or fails",
    )


@check_with(_ipr, "ipr.log_level", "in-process restart: TORCH_CPP_LOG_LEVEL error|fatal")
def log_level(ipr: InProcessRestart, ctx: DoctorContext) -> Finding:
    found = _env_check(ctx, "TORCH_CPP_LOG_LEVEL", {"error", "fatal"}, "error",
                       "every restart floods the log with c10d warnings from aborted process groups")
    # Noise, not breakage: downgrade to a warning.
    return warn(found.saw, found.fix) if found.severity == "error" else found


@check_with(_ipr, "ipr.timeouts", "in-process restart: soft_timeout < hard_timeout < barrier_timeout")
def timeouts(ipr: InProcessRestart, ctx: DoctorContext) -> Finding:
    saw = f"soft_timeout={ipr.soft_timeout:g}s, hard_timeout={ipr.hard_timeout:g}s, barrier_timeout={ipr.barrier_timeout:g}s"
    if min(ipr.soft_timeout, ipr.hard_timeout, ipr.barrier_timeout) <= 0:
        return error(saw + ": timeouts must be positive", "set positive timeouts, e.g. 60 / 90 / 120 (the NVRx defaults)")
    if not ipr.soft_timeout < ipr.hard_timeout < ipr.barrier_timeout:
        return error(
            saw + ": NVRx's Wrapper rejects this order",
            "choose soft_timeout < hard_timeout < barrier_timeout, e.g. 60 < 90 < 120 (the NVRx defaults)",
        )
    return ok(saw)


@check_with(_ipr, "ipr.heartbeat", "in-process restart: heartbeat_interval < heartbeat_timeout < barrier_timeout")
def heartbeat(ipr: InProcessRestart, ctx: DoctorContext) -> Finding:
    saw = (f"heartbeat_interval={ipr.heartbeat_interval:g}s, heartbeat_timeout={ipr.heartbeat_timeout:g}s, "
           f"barrier_timeout={ipr.barrier_timeout:g}s")
    if not 0 < ipr.heartbeat_interval < ipr.heartbeat_timeout:
        return error(saw + ": a rank would be declared missing between two heartbeats",
                     "set heartbeat_interval well below heartbeat_timeout, e.g. 30 and 60 (the NVRx defaults)")
    if not ipr.heartbeat_timeout < ipr.barrier_timeout:
        return error(saw + ": the barrier gives up before a missing rank is detected",
                     "set heartbeat_timeout < barrier_timeout, e.g. 60 < 120 (the NVRx defaults)")
    return ok(saw)


@check_with(_ipr, "ipr.watchdog", "NCCL watchdog (process-group timeout) exceeds hard_timeout")
def watchdog(ipr: InProcessRestart, ctx: DoctorContext) -> Finding:
    pg, source = ctx.pg_timeout
    saw = f"process-group timeout {pg:g}s ({source}), hard_timeout={ipr.hard_timeout:g}s"
    # The watchdog ends the process only with 1 (the default) or 3; with 2 it raises in the rank, where the
    # Wrapper catches it, with 0 it does nothing.
    handling = ctx.effective_env.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1").strip()
    if handling in ("0", "2"):
        return ok(f"{saw}; TORCH_NCCL_ASYNC_ERROR_HANDLING={handling}: the watchdog does not end the process")
    if pg <= ipr.hard_timeout:
        minutes = int(ipr.hard_timeout // 60) + 2
        return error(
            saw + ": the NCCL watchdog aborts the process before in-process restart can recover it",
            f"raise the process-group timeout above hard_timeout, e.g. dist.distributed_timeout_minutes: {minutes} "
            f"(init_process_group(timeout=timedelta(minutes={minutes}))), or lower hard_timeout",
        )
    return ok(saw)


@check_with(_ipr, "ipr.nccl_heartbeat", "NCCL heartbeat monitor (TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC) exceeds hard_timeout")
def nccl_heartbeat(ipr: InProcessRestart, ctx: DoctorContext) -> Finding:
    env = ctx.effective_env
    if env.get("TORCH_NCCL_ENABLE_MONITORING", "1").strip() == "0":
        return ok("TORCH_NCCL_ENABLE_MONITORING=0: the watchdog monitor is off")
    raw = env.get("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC")
    try:
        value = NCCL_HEARTBEAT_DEFAULT_S if raw is None else float(raw)
    except ValueError:
        return error(f"TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC={raw!r} is not a number",
                     f"export TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC={int(NCCL_HEARTBEAT_DEFAULT_S)} (seconds)")
    saw = f"TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC={value:g}{' (default)' if raw is None else ''}, hard_timeout={ipr.hard_timeout:g}s"
    if value <= ipr.hard_timeout:
        return error(saw + ": the heartbeat monitor kills a process whose watchdog is stuck before NVRx recovers it",
                     f"export TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC={int(ipr.hard_timeout * 2)} (above hard_timeout)")
    return ok(saw)


# ---- versions --------------------------------------------------------------------------------------


def version_or_none(text: str | None) -> Version | None:
    try:
        return Version(text) if text else None
    except InvalidVersion:
        return None


@check("versions.torch", "torch version")
def torch_version(ctx: DoctorContext) -> Finding:
    v = ctx.versions()
    tv = version_or_none(v.torch)
    if tv is None:
        return error(f"torch cannot be imported ({v.torch_error or v.torch})",
                     f"pip install 'torch>={IPR_MIN_TORCH if ctx.ipr else MIN_TORCH}'")
    if tv.release < MIN_TORCH.release:
        return error(f"torch {v.torch} is older than mbr-launch supports", f"pip install 'torch>={MIN_TORCH}'")
    if ctx.ipr and tv.release < IPR_MIN_TORCH.release:
        return error(f"torch {v.torch}: in-process restart needs torch >= {IPR_MIN_TORCH}",
                     f"pip install 'torch>={IPR_MIN_TORCH}', or turn in-process restart off")
    return ok(f"torch {v.torch}" + (f" (CUDA {v.cuda})" if v.cuda else " (CPU build)"))


@check("versions.nccl", "NCCL version")
def nccl_version(ctx: DoctorContext) -> Finding:
    v = ctx.versions()
    nv = version_or_none(v.nccl)
    if nv is None:
        return skip(f"no NCCL in this torch build ({'torch missing' if not v.torch else 'CPU build' if not v.cuda else 'unknown'})")
    saw = f"NCCL {v.nccl}"
    if ctx.ipr is None:
        return ok(saw)
    if nv < IPR_MIN_NCCL:
        return error(f"{saw}: in-process restart needs NCCL >= {IPR_MIN_NCCL}",
                     f"install a torch built with NCCL >= {IPR_MIN_NCCL} or pip install 'nvidia-nccl-cu12>={IPR_MIN_NCCL}'")
    if IPR_BAD_NCCL[0] <= nv <= IPR_BAD_NCCL[1]:
        return error(f"{saw}: NCCL {IPR_BAD_NCCL[0]} to {IPR_BAD_NCCL[1]} segfault during in-process restart",
                     "pip install 'nvidia-nccl-cu12>=2.28.9' (or a 2.27.x), or turn in-process restart off")
    return ok(saw + " (meets in-process restart requirements)")


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
