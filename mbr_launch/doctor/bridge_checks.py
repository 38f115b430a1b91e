"""The Megatron-Bridge config (``--config FILE``) against the resiliency pitfalls of its documentation (the
watchdog and torchrun pitfalls: ``ipr.watchdog``, ``launcher.torchrun``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mbr_launch.doctor.context import DoctorContext
from mbr_launch.doctor.registry import Finding, check, check_with, error, info, ok, skip, warn

if TYPE_CHECKING:  # loaded by the context only when --config names a file
    from mbr_launch.doctor.mbridge import BridgeConfig

LOCAL_CKPT_ALGOS = {"fully_parallel", "atomic"}
# NeMo-Run leaves no standard marker in the job's environment; these are the ones it is known to use.
NEMO_RUN_MARKERS = ("NEMORUN_HOME", "NEMO_RUN_", "TORCHX_")


def _loaded(ctx: DoctorContext) -> BridgeConfig | Finding:
    if ctx.config_path is None:
        return skip("no --config given")
    return skip("config not loaded (see config.load)") if ctx.bridge_ok is None else ctx.bridge_ok


@check("config.load", "Megatron-Bridge config readable, every key known")
def load(ctx: DoctorContext) -> Finding:
    if ctx.config_path is None:
        return skip("no --config given")
    cfg = ctx.bridge
    if cfg is None or isinstance(cfg, Exception):
        return error(str(cfg), "fix the file path or YAML syntax")
    errors = [f"{p.path}: {p.message}" for p in cfg.problems if p.severity == "error"]
    infos = [p.path for p in cfg.problems if p.severity == "info"]
    if errors:
        return error("; ".join(errors), "fix or remove these keys: a misspelt key silently keeps the default")
    if infos:
        return info(f"{cfg.path}: loaded; not checked (no resiliency meaning known): {', '.join(infos)}")
    return ok(f"{cfg.path}: all keys known")


@check_with(_loaded, "config.async_save", "checkpoint.async_save needs ckpt_format torch_dist")
def async_save(cfg: BridgeConfig, ctx: DoctorContext) -> Finding:
    ck = cfg.checkpoint
    if not ck.async_save:
        return ok("async_save off")
    if ck.ckpt_format != "torch_dist":
        return error(f"checkpoint.async_save=true with ckpt_format={ck.ckpt_format!r}: async save only works with "
                     "torch_dist and otherwise fails or silently saves nothing",
                     "set checkpoint.ckpt_format: torch_dist, or checkpoint.async_save: false")
    return ok("async_save with ckpt_format torch_dist")


@check("config.ipr_conflicts", "in-process restart without the preemption plugin or NeMo-Run")
def ipr_conflicts(ctx: DoctorContext) -> Finding:
    if ctx.ipr is None:
        return skip("in-process restart not enabled")
    cfg = ctx.bridge_ok
    if cfg is not None and cfg.train.exit_signal_handler:
        return error("in-process restart with train.exit_signal_handler=true (what the preemption plugin sets): "
                     "the two are not compatible",
                     "set train.exit_signal_handler: false and drop PreemptionPlugin, or turn in-process restart off")
    markers = sorted(k for k in ctx.env if k.startswith(NEMO_RUN_MARKERS))
    if markers:
        return warn(f"in-process restart and NeMo-Run markers in the environment ({', '.join(markers)}): "
                    "NeMo-Run's executors do not support in-process restart",
                    "launch directly: `srun --kill-on-bad-exit=0 ... python train.py` or mbr-launch")
    return ok("no preemption handler and no NeMo-Run markers")


@check_with(_loaded, "config.straggler", "only one straggler detector (NVRx, not legacy)")
def straggler(cfg: BridgeConfig, ctx: DoctorContext) -> Finding:
    nvrx = bool(cfg.nvrx_straggler and cfg.nvrx_straggler.enabled)
    legacy = bool(cfg.straggler and cfg.straggler.log_straggler)
    if nvrx and legacy:
        return warn("nvrx_straggler.enabled and the legacy straggler.log_straggler are both on: two detectors "
                    "profile the same kernels and report conflicting scores",
                    "keep nvrx_straggler and set straggler: null (or straggler.log_straggler: false)")
    if legacy:
        return info("legacy straggler detector on", "prefer nvrx_straggler.enabled: true and straggler: null")
    return ok("NVRx straggler detection on" if nvrx else "no straggler detection")


@check_with(_loaded, "config.straggler_stop", "NVRx straggler detection stops training when it finds one")
def straggler_stop(cfg: BridgeConfig, ctx: DoctorContext) -> Finding:
    s = cfg.nvrx_straggler
    if not (s and s.enabled):
        return skip("NVRx straggler detection not enabled")
    if not s.stop_if_detected:
        return info("nvrx_straggler.stop_if_detected=false: stragglers are logged, training goes on at their pace",
                    "set nvrx_straggler.stop_if_detected: true to stop and let the launcher restart without them")
    return ok("stop_if_detected=true")


@check_with(_loaded, "config.rerun", "rerun state machine limited to NaN checks (the rest is alpha)")
def rerun(cfg: BridgeConfig, ctx: DoctorContext) -> Finding:
    r = cfg.rerun_state_machine
    alpha = []
    if r.rerun_mode != "disabled":
        alpha.append(f"rerun_mode={r.rerun_mode}")
    if r.check_for_spiky_loss:
        alpha.append("check_for_spiky_loss=true")
    if alpha:
        return warn(f"rerun state machine beyond NaN checks ({', '.join(alpha)}) is alpha; exit codes 16/17 "
                    "ask the launcher to resume or stop",
                    "keep rerun_mode: disabled and check_for_nan_in_loss: true unless you are testing it")
    return ok("NaN check in loss" if r.check_for_nan_in_loss else "rerun state machine off")


@check_with(_loaded, "config.local_ckpt", "NVRx local checkpointing settings")
def local_ckpt(cfg: BridgeConfig, ctx: DoctorContext) -> Finding:
    ck = cfg.checkpoint
    if ck.non_persistent_ckpt_type != "local" and not ck.non_persistent_local_ckpt_dir:
        return skip("local checkpointing not configured")
    if ck.non_persistent_ckpt_type == "local" and not ck.non_persistent_local_ckpt_dir:
        return error("non_persistent_ckpt_type=local without non_persistent_local_ckpt_dir",
                     "set checkpoint.non_persistent_local_ckpt_dir to node-local storage, e.g. /local/scratch/ckpt")
    if ck.non_persistent_local_ckpt_algo not in LOCAL_CKPT_ALGOS:
        return error(f"non_persistent_local_ckpt_algo={ck.non_persistent_local_ckpt_algo!r}",
                     f"use one of {', '.join(sorted(LOCAL_CKPT_ALGOS))}")
    if ck.non_persistent_ckpt_type != "local":
        return warn(f"non_persistent_local_ckpt_dir set but non_persistent_ckpt_type={ck.non_persistent_ckpt_type!r}: "
                    "local checkpoints are never written", "set checkpoint.non_persistent_ckpt_type: local")
    if ctx.workers_nvrx.version is None:
        return error("local checkpointing needs nvidia-resiliency-ext, which is not installed",
                     "pip install nvidia-resiliency-ext")
    return ok(f"local checkpoints in {ck.non_persistent_local_ckpt_dir} ({ck.non_persistent_local_ckpt_algo})")


@check_with(_loaded, "config.ft_simulate", "fault simulation off in production")
def ft_simulate(cfg: BridgeConfig, ctx: DoctorContext) -> Finding:
    if cfg.ft and cfg.ft.simulate_fault:
        return warn(f"ft.simulate_fault=true: a rank will be {cfg.ft.simulated_fault_type} on purpose",
                    "set ft.simulate_fault: false unless you are testing restarts")
    return ok("no simulated faults")
