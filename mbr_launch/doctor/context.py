"""Everything a check may read, in one frozen object: declared settings plus injected probes (tests build one
from values and fakes). Derived views are cached, so each check sees the same answer.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from mbr_launch.cluster import torch_internals
from mbr_launch.cluster.torch_internals import Patch
from mbr_launch.config.host import workers_nvrx
from mbr_launch.config.nvrx import NvrxFound
from mbr_launch.config.parse import parse_nnodes
from mbr_launch.doctor import probes, processes
from mbr_launch.doctor.probes import Limit, NvmlView, Versions
from mbr_launch.health.gpuowners import Job, Reading
from mbr_launch.health.nvml import GpuMemory, memories as nvml_memories, view as nvml_view

if TYPE_CHECKING:  # imported where used: a launch without a Megatron-Bridge config never needs them
    from mbr_launch.doctor.mbridge import BridgeConfig, BridgeConfigError, InProcessRestart

# torch's default for NCCL process groups (ProcessGroupNCCL's kProcessGroupNCCLDefaultTimeout).
TORCH_NCCL_DEFAULT_PG_TIMEOUT_S = 600.0
# A script that imports NVRx's in-process restart package, in any of the ways Python allows.
_USES_INPROCESS = re.compile(r"nvidia_resiliency_ext\.inprocess\b"
                             r"|from\s+nvidia_resiliency_ext\s+import\s[^\n]*\binprocess\b")


@dataclass(frozen=True)
class DoctorContext:
    env: Mapping[str, str] = field(default_factory=dict)
    nproc_per_node: str = "1"
    nnodes: str = "1"  # "N" or "MIN:MAX"
    rdzv_backend: str = "c10d"
    rdzv_endpoint: str = ""
    standalone: bool = False
    master_addr: str | None = None
    master_port: int | None = None
    log_dir: str | None = None
    launcher: str = "mbr-launch"  # who starts the workers: mbr-launch, ft_launcher, torchrun, srun, none
    ft_enabled: bool = False  # the user declared fault-tolerance settings (flags or ft_launcher-style)
    config_path: str | None = None  # Megatron-Bridge YAML
    inprocess: Mapping[str, Any] | None = None  # declared in-process-restart settings
    pg_timeout_s: float | None = None  # declared process-group (NCCL watchdog) timeout
    restart_policy: str = "any-failed"  # the launcher's --ft-restart-policy (any-failed | min-healthy)
    script: str | None = None  # the training script's path (None for -m and --no-python)
    script_args: tuple[str, ...] = ()
    # ft_launcher's options as given (setting name -> value as typed) and the command line's option strings.
    ft_given: Mapping[str, Any] = field(default_factory=dict)
    flags: tuple[str, ...] = ()
    disk_paths: tuple[str, ...] = ()
    rdzv_timeout_s: float = 2.0  # how long a reachability probe may wait
    # Probes: real by default, replaced in tests.
    versions: Callable[[], Versions] = probes.versions
    # Whether each patch of torch's private rendezvous parts installs (a throwaway handler, nothing patched).
    torch_patches: Callable[[], list[Patch]] = torch_internals.status
    nvml: Callable[[], NvmlView] = nvml_view
    gpu_memory: Callable[[Sequence[str]], "list[GpuMemory] | str"] = nvml_memories  # NVML's answers
    gpu_owners: Callable[[Sequence[GpuMemory], Job], Reading] = probes.gpu_owners  # /proc's: whose they are
    ulimits: Callable[[], Mapping[str, Limit]] = probes.ulimits
    shm_bytes: Callable[[], int | None] = probes.shm_bytes
    disk_free: Callable[[str], int] = probes.disk_free
    port_free: Callable[[str, int], bool] = probes.port_free
    reachable: Callable[[str, int, float], bool] = probes.reachable
    resolve: Callable[[str], list[str]] = probes.resolve
    local_addresses: Callable[[], set[str]] = probes.local_addresses
    reverse_lookup: Callable[[str, float], float | None] = probes.reverse_lookup_seconds
    rdma_devices: Callable[[], list[str]] = probes.rdma_devices
    other_launchers: Callable[[], list[processes.LauncherProcess]] = processes.other_launchers
    uid: int = field(default_factory=os.getuid)  # whose launchers count (launcher.per_node)
    run_id: str | None = None  # the launch's rendezvous id: its workers' processes are the job's (gpu.strangers)
    script_head: Callable[[str], str | None] = probes.script_head
    find_nvrx: Callable[[Mapping[str, str]], NvrxFound] = workers_nvrx  # the NVRx a worker started with env imports

    @classmethod
    def from_values(cls, **kwargs: Any) -> DoctorContext:
        """A context from values as a CLI hands them over (strings, iterables); ``env`` defaults to ``os.environ``."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(kwargs) - names
        if unknown:
            raise TypeError(f"unknown DoctorContext fields: {', '.join(sorted(unknown))}")
        kwargs["env"] = dict(kwargs.get("env", os.environ))
        kwargs["ft_given"] = dict(kwargs.get("ft_given") or {})
        for key in ("disk_paths", "script_args", "flags"):
            kwargs[key] = tuple(kwargs.get(key) or ())
        for key, conv in (("master_port", int), ("pg_timeout_s", float)):
            if kwargs.get(key) is not None:
                kwargs[key] = conv(kwargs[key])
        for key in ("nproc_per_node", "nnodes"):
            if key in kwargs:
                kwargs[key] = str(kwargs[key])
        return cls(**kwargs)

    # ---- derived views -------------------------------------------------------------------------

    @cached_property
    def bridge(self) -> BridgeConfig | BridgeConfigError | None:
        """The loaded Megatron-Bridge config, the error that stopped loading it, or None without one."""
        if not self.config_path:
            return None
        from mbr_launch.doctor import mbridge  # noqa: PLC0415 - its 11 dataclasses cost every launch ~15 ms

        try:
            return mbridge.load(self.config_path)
        except mbridge.BridgeConfigError as exc:
            return exc

    @property
    def bridge_ok(self) -> BridgeConfig | None:
        return None if isinstance(self.bridge, Exception) else self.bridge

    @cached_property
    def workers_nvrx(self) -> NvrxFound:
        """The NVRx the workers will import: launch options whose meaning changed between versions follow it."""
        return self.find_nvrx(self.env)

    @cached_property
    def effective_env(self) -> Mapping[str, str]:
        # Bridge applies config env_vars as defaults; the process environment wins (ConfigContainer).
        base = dict(self.bridge_ok.env_vars) if self.bridge_ok else {}
        base.update(self.env)
        return base

    @cached_property
    def ipr(self) -> InProcessRestart | None:
        """Bridge defaults < config ``inprocess_restart`` < declared ``inprocess`` (declared counts as enabled),
        or None when not enabled."""
        cfg = self.bridge_ok.inprocess_restart if self.bridge_ok else None
        values = dataclasses.asdict(cfg) if cfg else {}
        if self.inprocess is not None:
            values.update(self.inprocess)
            if "enabled" not in self.inprocess:
                values["enabled"] = True
        if not values.get("enabled"):
            return None
        from mbr_launch.doctor.mbridge import InProcessRestart  # noqa: PLC0415 - see bridge

        known = {f.name for f in dataclasses.fields(InProcessRestart)}
        return InProcessRestart(**{k: v for k, v in values.items() if k in known})

    @cached_property
    def ipr_signal(self) -> str | None:
        """Why in-process restart is taken to be on (settings, ``--inprocess-restart``, a script importing NVRx's
        ``inprocess``), or None."""
        if self.ipr is not None:
            return "in-process restart is enabled in the configuration"
        if "--inprocess-restart" in self.script_args:
            return "the script is given --inprocess-restart (Megatron-LM)"
        text = self.script_head(self.script) if self.script else None
        if text and _USES_INPROCESS.search(text):
            return f"{os.path.basename(self.script or '')} uses nvidia_resiliency_ext.inprocess"
        return None

    @property
    def ft_declared(self) -> bool:
        ft = self.bridge_ok.ft if self.bridge_ok else None
        return self.ft_enabled or bool(ft and ft.enable_ft_package)

    @property
    def pg_timeout(self) -> tuple[float, str]:
        """(seconds, where it came from) of the process-group timeout the NCCL watchdog enforces."""
        if self.pg_timeout_s is not None:
            return self.pg_timeout_s, "declared process-group timeout"
        cfg = self.bridge_ok
        if cfg and cfg.declared_dist_timeout:
            return cfg.dist.distributed_timeout_minutes * 60, "dist.distributed_timeout_minutes"
        if cfg:
            return cfg.dist.distributed_timeout_minutes * 60, "Megatron default distributed_timeout_minutes=10"
        return TORCH_NCCL_DEFAULT_PG_TIMEOUT_S, "torch's NCCL default (none declared)"

    @property
    def max_nodes(self) -> int:
        return parse_nnodes(self.nnodes)[1]

    @property
    def on_slurm(self) -> bool:
        return "SLURM_JOB_ID" in self.env or "SLURM_PROCID" in self.env
