"""The validated launch configuration: one frozen value of nested typed specs, built by ``config.build``.

Each spec is what one part of the agent reads; values are checked once, and code past ``build_config`` never
re-validates them."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, fields
from typing import Any, Literal, Mapping

from mbr_launch.config.slurm import SlurmEnv
from mbr_launch.decide.policy import RestartPolicy, When

RdzvBackend = Literal["c10d", "static"]
StackDump = Literal["auto", "py-spy", "faulthandler", "off"]
StatusMode = Literal["auto", "live", "plain", "off"]
StandbyLevel = Literal["off", "interpreter", "torch", "cuda"]


@dataclass(frozen=True)
class StdSpec:
    """torchrun's -r/-t value: which streams of which local ranks (1 stdout, 2 stderr, 3 both)."""

    default: int = 0
    per_rank: Mapping[int, int] = field(default_factory=dict)

    def for_rank(self, local_rank: int) -> int:
        return self.per_rank.get(local_rank, self.default)


@dataclass(frozen=True)
class FaultToleranceSpec:
    """What the rank monitor enforces and NVRx clients read, in NVRx 0.7's FaultToleranceConfig field names (the
    defaults past ``link_down_path_template`` are 0.7's). ``user_set``: the fields the user gave; a client gets
    its own version's default for the others."""

    initial_rank_heartbeat_timeout: float | None
    rank_heartbeat_timeout: float | None
    rank_section_timeouts: Mapping[str, float | None]
    rank_out_of_section_timeout: float | None
    workload_check_interval: float
    safety_factor: float
    rank_termination_signal: str
    log_level: str  # DEBUG ... CRITICAL, or a number between them ("15") from a YAML file
    node_health_check_interval: float
    restart_check_interval: float
    enable_nic_monitor: bool
    pci_topo_file: str | None
    link_down_path_template: str | None
    enable_nic_healthcheck: bool = True
    enable_dist_storage_healthcheck: bool = False
    storage_healthcheck_path: str | None = None  # comma-separated absolute paths, as NVRx holds them
    link_state_path_template: str | None = None
    skip_section_response: bool = True
    segment: int | None = None
    numa_bind_strict: bool = True
    gpu_memory_reclaim_timeout: float = 50.0
    gpu_memory_tolerance_mb: float = 512.0
    gpu_memory_poll_interval: float = 2.0
    check_remaining_processes: bool = False
    max_no_progress_cycles: int = 3
    min_progress_iterations: int = 1
    checkpoint_iteration_file: str | None = None
    install_exception_hook: bool = False
    num_warmup_iterations: int = 5
    attribution_endpoint: str | None = None
    attribution_stop_action: str | None = None
    attribution_export_url: str | None = None
    cycle_info_dir: str | None = None
    segment_health_check_dir: str | None = None
    user_set: tuple[str, ...] = ()

    def as_nvrx_dict(self) -> dict[str, Any]:
        """Every field with the types NVRx holds (an int log level); ``user_set`` sorted."""
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "user_set"}
        data["rank_section_timeouts"] = dict(self.rank_section_timeouts)
        data["log_level"] = int(self.log_level) if self.log_level.isdigit() else logging.getLevelName(self.log_level)
        data["user_set"] = sorted(self.user_set)
        return data


@dataclass(frozen=True)
class RendezvousSpec:
    backend: RdzvBackend
    endpoint: str  # HOST:PORT; "localhost:0" for a standalone job (a free port is picked)
    run_id: str
    min_nodes: int
    max_nodes: int
    conf: Mapping[str, Any]  # --rdzv-conf (static: plus "rank")
    join_timeout: float  # seconds; --rdzv-conf join_timeout, default 600
    standalone: bool
    node_rank: int  # static rendezvous; the fallback group rank when none was assigned yet
    local_addr: str | None
    peer_timeout: float  # seconds of silence after which another node counts as lost (> 0)
    secret_file: str | None = None  # --rdzv-secret-file: the path only (this spec is recorded; the secret is not)

    @property
    def elastic(self) -> bool:
        return self.min_nodes < self.max_nodes


@dataclass(frozen=True)
class WorkersSpec:
    nproc_per_node: int
    entrypoint: tuple[str, ...]  # argv of one worker, before per-rank env
    script_args: tuple[str, ...]
    use_boot: bool  # run through mbr_launch.shim.boot (False with --no-python)
    role: str
    omp_num_threads: str | None  # set in workers when the user did not set it
    virtual_local_rank: bool
    signals_to_handle: tuple[str, ...]  # caught by the launcher and forwarded
    shutdown_timeout: float  # seconds between SIGTERM and SIGKILL for a stopped worker

    def argv(self, local_rank: int) -> list[str]:
        """One worker's command line, ``${local_rank}`` substituted as torchrun does."""
        return [a.replace("${local_rank}", str(local_rank)) for a in (*self.entrypoint, *self.script_args)]


@dataclass(frozen=True)
class MonitorSpec:
    enabled: bool  # --rank-monitor on
    stack_dump: StackDump
    hang_kill_grace: float  # seconds between SIGTERM and SIGKILL for a hung worker
    inquiry_timeout: float = 2.0  # seconds every node gathers hang evidence before the verdict


@dataclass(frozen=True)
class OutputSpec:
    log_dir: str | None
    redirects: StdSpec
    tee: StdSpec
    local_ranks_filter: frozenset[int] | None  # None: every local rank is shown
    duplicate_stdout_filters: tuple[str, ...]
    duplicate_stderr_filters: tuple[str, ...]
    quiet: bool
    status: StatusMode
    status_interval: float
    keep_runs: int = 20  # run folders kept in the default base (0: all)
    # torchrun's --log-line-prefix-template: the prefix of a rank's console lines ("": [rank${rank}]:)
    line_prefix_template: str = ""


@dataclass(frozen=True)
class TelemetrySpec:
    autobeat: bool
    initial_step_timeout: float | None
    step_timeout: float | None
    straggler_threshold: float
    straggler_interval: float
    stop_on_straggler: bool


@dataclass(frozen=True)
class PreemptionSpec:
    signals: tuple[str, ...]  # signals that mean preemption
    forward_signal: str  # what the workers get
    grace: float  # seconds to checkpoint before SIGKILL
    requeue: bool  # --requeue-on-preemption
    max_requeues: int | None


@dataclass(frozen=True)
class StandbySpec:
    level: StandbyLevel
    preload: tuple[str, ...]  # modules each standby imports ahead of time
    # The level's default list, not the user's: a module that cannot be imported there is skipped without a word.
    preload_default: bool = False
    why: str | None = None  # why the level is not the one asked for (None: it is)


@dataclass(frozen=True)
class PreflightSpec:
    """The doctor's view: the settings as declared, before the Slurm and standalone derivations it judges itself."""

    skip_checks: tuple[str, ...]
    nproc_per_node: str
    nnodes: str
    rdzv_backend: str
    rdzv_endpoint: str
    standalone: bool
    master_addr: str
    master_port: int | None
    log_dir: str | None
    ft_declared: bool  # the user set some fault-tolerance setting
    config_path: str | None
    pg_timeout: float | None
    restart_policy: When = When.ANY_FAILED  # ft_launcher's --ft-restart-policy
    script: str | None = None  # the training script's path, for the in-process-restart checks (None with -m)
    script_args: tuple[str, ...] = ()
    # ft_launcher's options as typed (setting name -> value) and the command line's option strings, for the
    # checks against the workers' NVRx (doctor ``launcher.ft_options``).
    ft_given: Mapping[str, Any] = field(default_factory=dict)
    flags: tuple[str, ...] = ()


@dataclass(frozen=True)
class NvrxLauncherSpec:
    """ft_launcher 0.6/0.7's launcher features, each given its meaning here; off unless ``config.build`` fills them."""

    workers_nvrx: str | None = None  # the NVRx the workers import ("0.7.0"), whose defaults the values follow
    attribution_stop_action: Literal["log", "no-restart"] = "log"  # (no-restart: no requeue on preemption either)
    max_no_progress_cycles: int = 0
    min_progress_iterations: int = 1
    checkpoint_iteration_file: str | None = None
    no_restart_exit_code: int = 93
    cycle_info_dir: str | None = None
    cycle_info_job_id: str | None = None
    per_cycle_applog_prefix: str | None = None
    enable_nic_healthcheck: bool = False
    link_state_path_template: str | None = None
    enable_dist_storage_healthcheck: bool = False
    storage_healthcheck_paths: tuple[str, ...] = ()
    node_health_check_endpoint: str | None = None
    segment_health_check_dir: str | None = None
    segment: int | None = None
    gpu_memory_reclaim_timeout: float = 0.0  # seconds; 0: do not wait
    gpu_memory_tolerance_mb: float = 512.0
    gpu_memory_poll_interval: float = 2.0  # seconds, > 0
    check_remaining_processes: bool = False
    # With NVRX_GPUS_PER_NUMA: numactl --cpunodebind=N --membind=N (True), or --localalloc (False).
    numa_bind_strict: bool = True


@dataclass(frozen=True)
class LaunchConfig:
    rendezvous: RendezvousSpec
    workers: WorkersSpec
    output: OutputSpec
    ft: FaultToleranceSpec
    monitor: MonitorSpec
    policy: RestartPolicy
    preemption: PreemptionSpec
    standby: StandbySpec
    telemetry: TelemetrySpec
    preflight: PreflightSpec
    slurm: SlurmEnv | None
    warnings: tuple[str, ...] = ()
    nvrx: NvrxLauncherSpec = field(default_factory=NvrxLauncherSpec)
