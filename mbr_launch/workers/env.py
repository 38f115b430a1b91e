"""The environment of one worker: torchrun's variables, exactly, plus our fault-tolerance sockets (and, as
ft_launcher 0.6+ sets it, ``NVRX_CURRENT_CYCLE_INFO`` with ``--ft-cycle-info-dir``)."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

from mbr_launch.cluster.round import Round  # torch-free: the early standby pool builds envs before torch loads
from mbr_launch.config.model import LaunchConfig
from mbr_launch.contract import AUTOBEAT_ENV, AUTOBEAT_SOCKET_ENV, IGNORE_SIGNALS_ENV, STACK_FILE_ENV
from mbr_launch.report import cycleinfo
from mbr_launch.workers.flightrec import flight_env


# Set in the agent process only (see rendezvous.py); not part of what the user gave the workers.
_AGENT_ONLY = ("TORCH_DISABLE_SHARE_RDZV_TCP_STORE",)


def worker_env(cfg: LaunchConfig, rnd: Round, local_rank: int, environ: Mapping[str, str], *,
               error_file: Path, stack_file: Path | None, monitor_socket: str | None,
               launcher_socket: str | None, restart_count: int | None = None,
               autobeat_socket: str | None = None, flight_dir: Path | None = None,
               agent_store: bool = False) -> dict[str, str]:
    env = {k: v for k, v in environ.items() if k not in _AGENT_ONLY}
    rank = rnd.rank_offset + local_rank
    env.update({
        "LOCAL_RANK": str(local_rank),
        "RANK": str(rank),
        "GROUP_RANK": str(rnd.group_rank),
        "ROLE_RANK": str(rank),
        "ROLE_NAME": cfg.workers.role,
        "LOCAL_WORLD_SIZE": str(cfg.workers.nproc_per_node),
        "WORLD_SIZE": str(rnd.world_size),
        "GROUP_WORLD_SIZE": str(rnd.group_world_size),
        "ROLE_WORLD_SIZE": str(rnd.world_size),
        "MASTER_ADDR": rnd.master_addr,
        "MASTER_PORT": str(rnd.master_port),
        "TORCHELASTIC_RESTART_COUNT": str(rnd.restart_count if restart_count is None else restart_count),
        "TORCHELASTIC_MAX_RESTARTS": str(cfg.policy.max_restarts),
        "TORCHELASTIC_RUN_ID": cfg.rendezvous.run_id,
        # c10d: a fresh MASTER_PORT each round, served by group rank 0's agent when it could bind it, else by
        # global rank 0; static: the static endpoint, cleared between rounds (cluster.workerstore).
        "TORCHELASTIC_USE_AGENT_STORE": str(agent_store),
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
        "TORCHELASTIC_ERROR_FILE": str(error_file),
        # torchrun exports its handled signals to the workers' environment; scripts may read it.
        "TORCHELASTIC_SIGNALS_TO_HANDLE": ",".join(cfg.workers.signals_to_handle),
    })
    if cfg.workers.omp_num_threads is not None:
        env["OMP_NUM_THREADS"] = cfg.workers.omp_num_threads
    if cfg.workers.virtual_local_rank:
        env["LOCAL_RANK"] = "0"
        visible = environ.get("CUDA_VISIBLE_DEVICES")
        devices = visible.split(",") if visible else None
        env["CUDA_VISIBLE_DEVICES"] = devices[local_rank].strip() if devices else str(local_rank)
    ignored = [sig for sig in cfg.preemption.signals if sig != cfg.preemption.forward_signal]
    if ignored and cfg.workers.use_boot:
        # Slurm signals every process of the step: a worker must not die of SIGUSR1 before it checkpoints.
        env[IGNORE_SIGNALS_ENV] = ",".join(ignored)
    if cfg.nvrx.cycle_info_dir:  # ft_launcher 0.6+: the link to the current cycle's cycle-info file
        env[cycleinfo.ENV] = cycleinfo.current_path(cfg.nvrx.cycle_info_dir, cfg.nvrx.cycle_info_job_id, environ)
    if monitor_socket:
        env["FT_RANK_MONITOR_IPC_SOCKET"] = monitor_socket
    if launcher_socket:
        env["FT_LAUNCHER_IPC_SOCKET"] = launcher_socket
    if autobeat_socket and cfg.workers.use_boot:
        env[AUTOBEAT_ENV] = "1"  # mbr_launch.shim.boot installs the optimizer-step hook (mbr_launch.shim.autobeat)
        env[AUTOBEAT_SOCKET_ENV] = autobeat_socket
    if stack_file is not None and cfg.workers.use_boot and cfg.monitor.stack_dump in ("auto", "faulthandler"):
        env[STACK_FILE_ENV] = str(stack_file)
    if flight_dir is not None and cfg.workers.use_boot:
        # Flight Recorder (collective progress for the hang verdict); the user's own settings win.
        env.update(flight_env(flight_dir, environ))
    return env
