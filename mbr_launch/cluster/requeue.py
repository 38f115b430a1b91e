"""Requeue after preemption: node 0 alone asks Slurm to bring the job back, within a retry budget."""

from __future__ import annotations

import shutil
import subprocess
from typing import Callable

from mbr_launch.config.model import LaunchConfig


def requeue_allowed(cfg: LaunchConfig) -> tuple[bool, str]:
    if not cfg.preemption.requeue:
        return False, "requeue not enabled (--requeue-on-preemption)"
    if cfg.slurm is None:
        return False, "not a Slurm job"
    if cfg.preemption.max_requeues is not None and cfg.slurm.restart_count >= cfg.preemption.max_requeues:
        return False, (f"requeue budget spent: SLURM_RESTART_COUNT={cfg.slurm.restart_count} "
                       f">= --max-requeues {cfg.preemption.max_requeues}")
    return True, ""


def maybe_requeue(cfg: LaunchConfig, group_rank: int, say: Callable[[str], None]) -> bool | None:
    """None when no requeue was attempted (not asked, not node 0), else whether scontrol succeeded."""
    allowed, why = requeue_allowed(cfg)
    if not allowed:
        if cfg.preemption.requeue:
            say(f"not requeueing: {why}")
        return None
    if group_rank != 0:
        return None  # one requeue per job: node 0 asks, the others just exit
    assert cfg.slurm is not None
    scontrol = shutil.which("scontrol") or "scontrol"
    try:
        done = subprocess.run([scontrol, "requeue", cfg.slurm.job_id], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as err:
        say(f"scontrol requeue {cfg.slurm.job_id} failed: {err}")
        return False
    if done.returncode != 0:
        say(f"scontrol requeue {cfg.slurm.job_id} failed: {done.stderr.strip() or done.returncode}")
        return False
    say(f"requeued Slurm job {cfg.slurm.job_id} (requeue {cfg.slurm.restart_count + 1})")
    return True
