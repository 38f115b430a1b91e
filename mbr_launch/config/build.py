"""The validated launch configuration, built once from resolved settings.

``build_config`` is where bad input becomes one clear ``ConfigError`` (exit code 2): every check that can
be made before a single process starts is made here. What it must ask the machine (device counts, whether
a port is taken, whether a host is this one, whether the script exists) goes through an injected
``HostProbes``, so the whole of it runs in unit tests with fakes.
"""

from __future__ import annotations

import sys
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from mbr_launch.config.errors import ConfigError, SettingError
from mbr_launch.config.files import load_config_file
from mbr_launch.config.host import HostProbes
from mbr_launch.config.model import (FaultToleranceSpec, LaunchConfig, MonitorSpec, OutputSpec, PreemptionSpec,
                                     PreflightSpec, RendezvousSpec, StandbySpec, StdSpec, TelemetrySpec, WorkersSpec)
from mbr_launch.config.parse import (parse_endpoint, parse_nnodes, parse_nproc, parse_ranks_filter, parse_rdzv_conf,
                                     parse_seconds_env, parse_std)
from mbr_launch.config.settings import FAULT, SETTINGS, Resolved
from mbr_launch.config.slurm import SlurmEnv, SlurmError
from mbr_launch.contract import BOOT_MODULE, DEFAULT_PRELOAD
from mbr_launch.decide.policy import RestartPolicy

C10D_PORT = 29400  # torchrun's default for a c10d endpoint without a port
STATIC_PORT = 29500  # torchrun's default --master-port
# Fault-tolerance panel settings that are mbr-launch's own switches, not a declaration of NVRx timeouts.
_NOT_FT_DECLARATIONS = frozenset({"config", "rank_monitor", "stack_dump", "hang_kill_grace", "hang_inquiry_timeout"})


@dataclass(frozen=True)
class _Rendezvous:
    """The rendezvous settings after the Slurm defaults and before the standalone/static rules."""

    nnodes: str
    backend: str
    endpoint: str
    run_id: str
    node_rank: int


def _slurm_defaults(resolved: Resolved, environ: Mapping[str, str]) -> tuple[_Rendezvous, SlurmEnv | None,
                                                                            list[str]]:
    """Values derived from the Slurm step for the settings the user left at their defaults."""
    v = resolved.values
    declared = _Rendezvous(v["nnodes"], v["rdzv_backend"], v["rdzv_endpoint"], v["rdzv_id"], v["node_rank"])
    if v["slurm"] == "off" or v["standalone"]:
        return declared, None, []
    try:
        slurm = SlurmEnv.from_environ(environ)
    except SlurmError as err:
        raise ConfigError(str(err)) from None
    if slurm is None:
        if v["slurm"] == "on":
            raise ConfigError("--slurm on: this is not a Slurm job (SLURM_JOB_ID is not set)")
        return declared, None, []
    problem = slurm.check_one_launcher_per_node()
    if problem:
        raise ConfigError(problem)
    warnings = [w for w in (slurm.kill_on_bad_exit_warning(),) if w]

    def untouched(name: str) -> bool:
        return resolved.sources.get(name) == "default"

    backend = "c10d" if untouched("rdzv_backend") else declared.backend
    endpoint = declared.endpoint
    if untouched("rdzv_endpoint") and backend == "c10d":
        endpoint = slurm.rdzv_endpoint(v["slurm_rdzv_port"] or slurm.rdzv_port())
    return _Rendezvous(
        nnodes=str(slurm.nnodes()) if untouched("nnodes") else declared.nnodes,
        backend=backend, endpoint=endpoint,
        run_id=slurm.run_id() if untouched("rdzv_id") else declared.run_id,
        node_rank=slurm.node_rank() if untouched("node_rank") and slurm.node_id is not None else declared.node_rank,
    ), slurm, warnings


def _rendezvous(v: Mapping[str, Any], declared: _Rendezvous, nodes: tuple[int, int], slurm: SlurmEnv | None,
                probes: HostProbes, new_run_id: Callable[[], str]) -> RendezvousSpec:
    """torchrun's rendezvous rules (standalone, static defaults, endpoint ports), then the port checks."""
    min_nodes, max_nodes = nodes
    conf = parse_rdzv_conf(v["rdzv_conf"])
    backend, endpoint, run_id, node_rank = declared.backend, declared.endpoint, declared.run_id, declared.node_rank
    standalone = bool(v["standalone"])
    if standalone:
        backend, endpoint, run_id = "c10d", "localhost:0", new_run_id()
        if max_nodes > 1:
            raise ConfigError("--standalone runs one node; drop --standalone or use --nnodes 1")
    elif backend == "static" and max_nodes == 1 and v["master_port"] is None and not endpoint:
        # torchrun's rule: a single static node with no port becomes a private c10d rendezvous.
        backend, endpoint, run_id, standalone = "c10d", "localhost:0", new_run_id(), True
    if backend not in ("c10d", "static"):
        raise ConfigError(f"--rdzv-backend {backend}: only c10d and static are supported "
                          "(etcd is deprecated in torch)")
    if backend == "static":
        if min_nodes != max_nodes:
            raise ConfigError("--rdzv-backend static needs a fixed --nnodes N; use c10d for MIN:MAX")
        if not endpoint:
            endpoint = f"{v['master_addr']}:{v['master_port'] if v['master_port'] is not None else STATIC_PORT}"
        conf["rank"] = node_rank
        if node_rank >= max_nodes:
            raise ConfigError(f"--node-rank {node_rank} must be below --nnodes {max_nodes}")
    if not endpoint:
        raise ConfigError("--rdzv-endpoint is required for a multi-node c10d rendezvous (HOST:PORT); "
                          "use --standalone for one node")
    host, port = parse_endpoint(endpoint)
    if backend == "c10d" and port is None:
        endpoint, port = f"{endpoint}:{C10D_PORT}", C10D_PORT
    if port and probes.is_local_host(host) and probes.port_taken(host or "127.0.0.1", port):
        if backend == "static" and node_rank == 0:
            raise ConfigError(f"port {port} on {host} is already in use: rank 0 must host the store there; "
                              "pick a free --master-port")
        if backend == "c10d" and max_nodes == 1 and slurm is None and not probes.listener_is_launcher(port):
            raise ConfigError(f"port {port} on {host} is in use by another program; pick a free port "
                              "in --rdzv-endpoint (or use --standalone)")
    return RendezvousSpec(
        backend=backend, endpoint=endpoint, run_id=run_id, min_nodes=min_nodes, max_nodes=max_nodes, conf=conf,
        join_timeout=float(conf.get("join_timeout", 600)), standalone=standalone, node_rank=node_rank,
        local_addr=v["local_addr"], peer_timeout=float(v["peer_timeout"]))


def _entrypoint(script: str, v: Mapping[str, Any], environ: Mapping[str, str],
                probes: HostProbes) -> tuple[tuple[str, ...], bool]:
    """A worker's argv before its arguments, and whether it runs through the boot shim."""
    python = environ.get("PYTHON_EXEC", sys.executable)
    if "PYTHON_EXEC" in environ and not v["no_python"] and not probes.program_exists(python):
        raise ConfigError(f"PYTHON_EXEC={python!r} is not a program on this machine; unset it or point it at "
                          "a Python interpreter")
    if v["run_path"] or not (v["module"] or v["no_python"]):
        if not probes.is_file(script):
            if probes.is_dir(script):
                raise ConfigError(f"training script {script} is a directory; give the Python file to run "
                                  "(or pass -m for a module)")
            if probes.exists(script):
                raise ConfigError(f"training script {script} is not a regular file; give the Python file to run")
            raise ConfigError(f"training script {script} does not exist; check the path "
                              "(or pass -m for a module)")
        return (python, "-u", "-m", BOOT_MODULE, script), True
    if v["module"]:
        return (python, "-u", "-m", BOOT_MODULE, "-m", script), True
    # --no-python: the script is a program of its own
    if not probes.program_exists(script):
        raise ConfigError(f"program {script} (--no-python) was not found on PATH")
    return (script,), False


def _ft(v: Mapping[str, Any]) -> FaultToleranceSpec:
    return FaultToleranceSpec(
        initial_rank_heartbeat_timeout=v["initial_heartbeat_timeout"], rank_heartbeat_timeout=v["heartbeat_timeout"],
        rank_section_timeouts=v["section_timeouts"], rank_out_of_section_timeout=v["out_of_section_timeout"],
        workload_check_interval=v["workload_check_interval"], safety_factor=v["safety_factor"],
        rank_termination_signal=v["rank_termination_signal"], log_level=v["ft_log_level"],
        node_health_check_interval=v["node_health_check_interval"],
        restart_check_interval=v["restart_check_interval"], enable_nic_monitor=v["enable_nic_monitor"],
        pci_topo_file=v["pci_topo_file"], link_down_path_template=v["link_down_path_template"])


def preflight_spec(resolved: Resolved, *, script: str | None = None,
                   script_args: tuple[str, ...] = ()) -> PreflightSpec:
    """What the doctor checks, from the settings as declared (``mbr-launch doctor`` and the preflight), and
    the training script (a path; None for ``-m`` and ``--no-python``), where in-process restart may show."""
    v = resolved.values
    ft_declared = any(s.panel == FAULT and resolved.sources.get(s.name) != "default"
                      for s in SETTINGS if s.name not in _NOT_FT_DECLARATIONS)
    return PreflightSpec(
        skip_checks=tuple(v["skip_check"]), nproc_per_node=v["nproc_per_node"], nnodes=v["nnodes"],
        rdzv_backend="c10d" if v["standalone"] else v["rdzv_backend"],
        rdzv_endpoint="" if v["standalone"] else v["rdzv_endpoint"], standalone=v["standalone"],
        master_addr=v["master_addr"], master_port=v["master_port"], log_dir=v["log_dir"],
        ft_declared=ft_declared, config_path=v["config"], pg_timeout=v["pg_timeout"],
        restart_policy=v["restart_policy"],
        script=None if v["module"] or v["no_python"] else script, script_args=tuple(script_args))


def _fresh_run_id() -> str:
    return uuid.uuid4().hex[:12]


def _standby(resolved: Resolved, preload: Sequence[str] | None, script: str | None,
             probes: HostProbes) -> StandbySpec:
    """The standby level asked for, except that the default level does not preload torch for a script that
    imports only the standard library (``config.scriptscan``): that work would never be used."""
    v = resolved.values
    level = v["standby"]
    if (level == "torch" and preload is None and resolved.sources.get("standby") == "default"
            and not (v["module"] or v["no_python"]) and script and probes.stdlib_only_script(script)):
        return StandbySpec(level="interpreter", preload=(), preload_default=True,
                           why="the script imports only the standard library: nothing to preload")
    return StandbySpec(level=level, preload=DEFAULT_PRELOAD.get(level, ()) if preload is None else tuple(preload),
                       preload_default=preload is None)


def build_config(resolved: Resolved, *, script: str | None, script_args: tuple[str, ...] = (),
                 environ: Mapping[str, str], probes: HostProbes = HostProbes(),
                 new_run_id: Callable[[], str] = _fresh_run_id) -> LaunchConfig:
    """Validate and assemble. ``environ`` is the user's environment (read, never the process's own);
    ``probes`` answers the questions about this machine; ``new_run_id`` names a standalone job."""
    declared, slurm, warnings = _slurm_defaults(resolved, environ)
    v = resolved.values
    if not script:
        raise ConfigError("missing the training script: mbr-launch [OPTIONS] SCRIPT [ARGS...]")
    nodes = parse_nnodes(declared.nnodes)
    nproc = parse_nproc(v["nproc_per_node"], probes.device_count)
    rendezvous = _rendezvous(v, declared, nodes, slurm, probes, new_run_id)

    shutdown_timeout = v["shutdown_timeout"]
    if shutdown_timeout is None:
        shutdown_timeout = parse_seconds_env("TORCH_ELASTIC_SHUTDOWN_TIMEOUT",
                                             environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "30"))
    ranks_filter = parse_ranks_filter(v["local_ranks_filter"])
    preload = v["standby_preload"]  # None: not given, the level's default list
    if preload and v["standby"] == "off":
        raise ConfigError("--standby-preload needs standbys: drop --standby off (or the preload list)")
    if v["logs_specs"] is not None:
        raise ConfigError("--logs-specs is not supported: mbr-launch writes its own log layout under --log-dir")
    if v["restart_policy"] == "min-healthy" and v["restart_scope"] != "job":
        raise ConfigError(f"--restart-policy min-healthy leaves a crashed rank lost, --restart-scope "
                          f"{v['restart_scope']} restarts it in place: drop one of them")
    if v["log_dir"] is not None and (problem := probes.log_dir_problem(v["log_dir"])):
        raise ConfigError(f"--log-dir: {problem}; give a directory this user can write")
    entrypoint, use_boot = _entrypoint(script, v, environ, probes)
    redirects, tee = parse_std("--redirects", v["redirects"]), parse_std("--tee", v["tee"])

    return LaunchConfig(
        rendezvous=rendezvous,
        workers=WorkersSpec(
            nproc_per_node=nproc, entrypoint=entrypoint, script_args=tuple(script_args), use_boot=use_boot,
            role=v["role"], omp_num_threads="1" if "OMP_NUM_THREADS" not in environ and nproc > 1 else None,
            virtual_local_rank=v["virtual_local_rank"], signals_to_handle=v["signals_to_handle"],
            shutdown_timeout=float(shutdown_timeout)),
        output=OutputSpec(
            log_dir=v["log_dir"], redirects=redirects, tee=tee, local_ranks_filter=ranks_filter,
            duplicate_stdout_filters=v["duplicate_stdout_filters"],
            duplicate_stderr_filters=v["duplicate_stderr_filters"], quiet=v["quiet"], status=v["status"],
            status_interval=float(v["status_interval"]), keep_runs=v["keep_runs"]),
        ft=_ft(v),
        monitor=MonitorSpec(enabled=v["rank_monitor"] == "on", stack_dump=v["stack_dump"],
                            hang_kill_grace=v["hang_kill_grace"], inquiry_timeout=v["hang_inquiry_timeout"]),
        policy=RestartPolicy(scope=v["restart_scope"], max_restarts=v["max_restarts"],
                             max_startup_restarts=v["max_startup_restarts"],
                             no_restart_exit_codes=v["no_restart_exit_codes"],
                             max_node_failures=v["max_node_failures"], backoff=v["restart_backoff"],
                             backoff_max=v["restart_backoff_max"], crash_loop_window=v["crash_loop_window"],
                             min_nodes=rendezvous.min_nodes, when=v["restart_policy"]),
        preemption=PreemptionSpec(
            signals=v["preempt_signals"], forward_signal=v["preempt_forward_signal"],
            grace=float(v["preempt_grace"] if v["preempt_grace"] is not None else shutdown_timeout),
            requeue=v["requeue_on_preemption"], max_requeues=v["max_requeues"]),
        standby=_standby(resolved, preload, script, probes),
        telemetry=TelemetrySpec(
            autobeat=v["autobeat"] == "on", initial_step_timeout=v["initial_step_timeout"],
            step_timeout=v["step_timeout"], straggler_threshold=v["straggler_threshold"],
            straggler_interval=v["straggler_interval"], stop_on_straggler=bool(v["stop_on_straggler"])),
        preflight=preflight_spec(resolved, script=script, script_args=tuple(script_args)),
        slurm=slurm, warnings=tuple(warnings),
    )


# ConfigError, SettingError, LaunchConfig, StdSpec and load_config_file stay importable from here (their old home).
__all__ = ["ConfigError", "HostProbes", "LaunchConfig", "SettingError", "StdSpec", "build_config",
           "load_config_file", "preflight_spec"]
