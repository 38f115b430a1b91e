"""The validated launch configuration, built once from resolved settings.

``build_config`` is where bad input becomes one ``ConfigError`` (exit 2): every check that can be made before
a process starts is made here. What it must ask the machine goes through an injected ``HostProbes``, so all
of it runs in unit tests with fakes. Values arrive already read as the workers' NVRx reads them
(``settings.for_workers_nvrx``); what is odd but workable becomes a warning the agent prints at start."""

from __future__ import annotations

import sys
import uuid
from dataclasses import dataclass, fields
from typing import Any, Callable, Mapping, Sequence

from mbr_launch.config.errors import ConfigError
from mbr_launch.config.host import HostProbes
from mbr_launch.config.model import (FaultToleranceSpec, LaunchConfig, MonitorSpec, NvrxLauncherSpec, OutputSpec,
                                     PreemptionSpec, PreflightSpec, RendezvousSpec, StandbySpec, TelemetrySpec,
                                     WorkersSpec)
from mbr_launch.config.nvrx import ALL_FT_FIELDS, NvrxFound, unclear
from mbr_launch.config.parse import (parse_endpoint, parse_nnodes, parse_nproc, parse_ranks_filter, parse_seconds_env,
                                     parse_std)
from mbr_launch.config.rdzvconf import check_rdzv_conf, parse_rdzv_conf
from mbr_launch.config.secret import SecretFileError, read_secret
from mbr_launch.config.settings import BY_FT_KEY, BY_NAME, COMPAT, FAULT, SETTINGS, Resolved, for_workers_nvrx
from mbr_launch.config.slurm import SlurmEnv, SlurmError
from mbr_launch.contract import BOOT_MODULE, DEFAULT_PRELOAD
from mbr_launch.decide.policy import RestartPolicy, Scope, When
from mbr_launch.report import exitcodes

C10D_PORT = 29400  # torchrun's default for a c10d endpoint without a port
STATIC_PORT = 29500  # torchrun's default --master-port
# Fault-tolerance panel settings that are mbr-launch's own switches, not a declaration of NVRx timeouts.
_NOT_FT_DECLARATIONS = frozenset({"config", "rank_monitor", "stack_dump", "hang_kill_grace", "hang_inquiry_timeout"})
_FT_PANELS = (FAULT, COMPAT)  # a setting given here declares fault tolerance (the doctor then wants NVRx)
# ft_launcher's own options (an --ft-* spelling), which the doctor compares with the workers' NVRx.
_FT_OPTIONS = frozenset(s.name for s in SETTINGS
                        if any(f.startswith(("--ft-", "--ft_")) or f == "--ignore-missing-fault-tol-cfg"
                               for f in s.flags))


@dataclass(frozen=True)
class _Rendezvous:
    nnodes: str
    backend: str
    endpoint: str
    run_id: str
    node_rank: int


def _slurm_defaults(resolved: Resolved, environ: Mapping[str, str]) -> tuple[_Rendezvous, SlurmEnv | None,
                                                                            list[str]]:
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


def picks_free_port(backend: str, endpoint: str) -> bool:
    """A c10d endpoint with port 0 (NeMo-Run's ``localhost:0`` for one node): torch binds a free port, which no
    other node could find."""
    if backend != "c10d" or not endpoint:
        return False
    try:
        return parse_endpoint(endpoint)[1] == 0
    except ConfigError:
        return False  # reported where the endpoint is checked


def _rendezvous(v: Mapping[str, Any], declared: _Rendezvous, nodes: tuple[int, int], slurm: SlurmEnv | None,
                probes: HostProbes, new_run_id: Callable[[], str]) -> tuple[RendezvousSpec, list[str]]:
    """torchrun's rendezvous rules, then the port checks; and the warning about unread --rdzv-conf keys, if any."""
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
    elif picks_free_port(backend, endpoint):
        if max_nodes > 1:
            raise ConfigError(f"--rdzv-endpoint {endpoint}: port 0 picks a free port on one node, which the other "
                              f"nodes of --nnodes {declared.nnodes} cannot find; give the first node's HOST:PORT")
        endpoint, standalone = "localhost:0", True  # the user's --rdzv-id stays the job's id
    if backend not in ("c10d", "static"):
        raise ConfigError(f"--rdzv-backend {backend}: only c10d and static are supported "
                          "(etcd is deprecated in torch)")
    warnings = check_rdzv_conf(conf, backend, probes.torch_version)
    # The store's timeout: c10d's join_timeout, or the static rendezvous's timeout (each 600 s in torch)
    join_timeout = float(conf.get("join_timeout" if backend == "c10d" else "timeout", 600))
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
    secret_file = v["rdzv_secret_file"] or None
    if secret_file is not None:
        if backend != "c10d":
            raise ConfigError(f"--rdzv-secret-file seals the c10d rendezvous store's values; --rdzv-backend "
                              f"{backend} has none: use --rdzv-backend c10d, or drop the secret")
        try:
            read_secret(secret_file)
        except SecretFileError as err:
            raise ConfigError(f"--rdzv-secret-file: {err}") from None
    return RendezvousSpec(
        backend=backend, endpoint=endpoint, run_id=run_id, min_nodes=min_nodes, max_nodes=max_nodes, conf=conf,
        join_timeout=join_timeout, standalone=standalone, node_rank=node_rank,
        local_addr=v["local_addr"], peer_timeout=float(v["peer_timeout"]), secret_file=secret_file), warnings


def _entrypoint(script: str, v: Mapping[str, Any], environ: Mapping[str, str],
                probes: HostProbes) -> tuple[tuple[str, ...], bool]:
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


def preflight_spec(resolved: Resolved, *, script: str | None = None, script_args: tuple[str, ...] = (),
                   flags: tuple[str, ...] = ()) -> PreflightSpec:
    """What the doctor checks: the settings as declared, the training script (None for ``-m`` and
    ``--no-python``) and the command line's option strings where the caller has them."""
    v = resolved.values
    ft_declared = any(s.panel in _FT_PANELS and resolved.given(s.name)
                      for s in SETTINGS if s.name not in _NOT_FT_DECLARATIONS)
    # One node on a c10d port 0 is a standalone launch for every check (a multi-node one is refused in build).
    standalone = bool(v["standalone"]) or (picks_free_port(v["rdzv_backend"], v["rdzv_endpoint"])
                                           and parse_nnodes(v["nnodes"])[1] == 1)
    return PreflightSpec(
        skip_checks=tuple(v["skip_check"]), nproc_per_node=v["nproc_per_node"], nnodes=v["nnodes"],
        rdzv_backend="c10d" if standalone else v["rdzv_backend"],
        rdzv_endpoint="" if standalone else v["rdzv_endpoint"], standalone=standalone,
        master_addr=v["master_addr"], master_port=v["master_port"], log_dir=v["log_dir"],
        ft_declared=ft_declared, config_path=v["config"], pg_timeout=v["pg_timeout"],
        restart_policy=When(v["restart_policy"]),
        script=None if v["module"] or v["no_python"] else script, script_args=tuple(script_args),
        ft_given={name: raw for name, raw in resolved.raw.items() if name in _FT_OPTIONS}, flags=tuple(flags))


def _fresh_run_id() -> str:
    return uuid.uuid4().hex[:12]


def _standby(resolved: Resolved, preload: Sequence[str] | None, script: str | None,
             probes: HostProbes) -> StandbySpec:
    """The standby level asked for, except that the default level does not preload torch for a script that
    imports only the standard library (``host.imports_only_stdlib``)."""
    v = resolved.values
    level = v["standby"]
    if (level == "torch" and preload is None and resolved.sources.get("standby") == "default"
            and not (v["module"] or v["no_python"]) and script and probes.stdlib_only_script(script)):
        return StandbySpec(level="interpreter", preload=(), preload_default=True,
                           why="the script imports only the standard library: nothing to preload")
    return StandbySpec(level=level, preload=DEFAULT_PRELOAD.get(level, ()) if preload is None else tuple(preload),
                       preload_default=preload is None)


# ---- ft_launcher's settings: the NVRx clients' config and ft_launcher 0.6/0.7's features ----------------------

# The launcher's own exit codes (report.exitcodes): a no-restart code equal to one of them cannot be told apart.
_OWN_CODES = {code: text for code, text in exitcodes.TABLE if isinstance(code, int)}


def _or_default(v: Mapping[str, Any], name: str) -> Any:
    value = v[name]
    return BY_NAME[name].default if value is None else value


# The FaultToleranceConfig fields whose none keeps the default.
_NONE_IS_DEFAULT = ("workload_check_interval", "safety_factor", "node_health_check_interval", "restart_check_interval",
                    "gpu_memory_tolerance_mb", "gpu_memory_poll_interval")


def user_set(resolved: Resolved) -> tuple[str, ...]:
    return tuple(sorted(s.ft_key for s in SETTINGS
                        if s.ft_key in ALL_FT_FIELDS and resolved.given(s.name)))  # type: ignore[misc]


def ft_spec(resolved: Resolved) -> FaultToleranceSpec:
    v = resolved.values
    data = {f.name: v[BY_FT_KEY[f.name].name] for f in fields(FaultToleranceSpec) if f.name != "user_set"}
    paths = v["storage_health_check_path"]
    data.update({name: _or_default(v, name) for name in _NONE_IS_DEFAULT},
                storage_healthcheck_path=",".join(paths) if paths else None,
                gpu_memory_reclaim_timeout=v["gpu_memory_reclaim_timeout"] or 0.0,
                attribution_stop_action=v["attribution_stop_action"] if resolved.given("attribution_stop_action")
                else None)
    return FaultToleranceSpec(**data, user_set=user_set(resolved))


def nvrx_spec(resolved: Resolved, *, found: NvrxFound, nodes: tuple[int, int], run_id: str,
              environ: Mapping[str, str]) -> NvrxLauncherSpec:
    """ft_launcher 0.6/0.7's launcher features; raises ``ConfigError`` for settings that contradict each other."""
    v = resolved.values
    segment, (min_nodes, max_nodes) = v["segment"], nodes
    if segment is not None and min_nodes % segment:
        low = segment * -(-min_nodes // segment)
        raise ConfigError(f"--ft-segment {segment}: the minimum number of nodes ({min_nodes}, from --nnodes) must be "
                          f"a multiple of it, as NVRx requires; use e.g. --nnodes {low}:{max(low, max_nodes)}, or "
                          "another --ft-segment")
    job_id = v["cycle_info_job_id"]
    if v["cycle_info_dir"] and not job_id:
        job_id = environ.get("SLURM_ARRAY_JOB_ID") or environ.get("SLURM_JOB_ID") or run_id
    # Each field is the setting of its name, but for these.
    same = {f.name: v[f.name] for f in fields(NvrxLauncherSpec) if f.name in BY_NAME}
    return NvrxLauncherSpec(**{
        **same, "workers_nvrx": found.version, "attribution_stop_action": v["attribution_stop_action"] or "log",
        "no_restart_exit_code": v["no_restart_exit_code"] & 0xFF, "cycle_info_job_id": job_id,
        "storage_healthcheck_paths": tuple(v["storage_health_check_path"] or ()),
        "gpu_memory_reclaim_timeout": float(v["gpu_memory_reclaim_timeout"] or 0.0),
        "gpu_memory_tolerance_mb": float(_or_default(v, "gpu_memory_tolerance_mb")),
        "gpu_memory_poll_interval": float(_or_default(v, "gpu_memory_poll_interval"))})


def nvrx_warnings(resolved: Resolved, found: NvrxFound) -> list[str]:
    """What is accepted but worth a line at start: a boolean word that only a rule gives a meaning, an exit code
    outside 0-255 or equal to one of the launcher's own."""
    out = []
    for name, raw in resolved.raw.items():
        lenient = getattr(BY_NAME[name].parse, "rule", None) or getattr(BY_NAME[name].parse, "for_generation", None)
        if lenient and unclear(raw):
            by = f"the ft_launcher of NVRx {found.version}" if found.version else "ft_launcher 0.7"
            out.append(f"{BY_NAME[name].flag} {raw!r} is read as {str(resolved.values[name]).lower()}, as {by} "
                       "reads it; write true or false to say which")
    if resolved.given("no_restart_exit_code"):
        code = resolved.values["no_restart_exit_code"]
        if not 0 <= code <= 255:
            out.append(f"--ft-no-restart-exit-code {code}: a shell sees exit status {code & 0xFF} ({code} modulo 256)")
        if (code & 0xFF) in _OWN_CODES:
            out.append(f"--ft-no-restart-exit-code {code}: mbr-launch also exits {code & 0xFF} when "
                       f"{_OWN_CODES[code & 0xFF].split(';')[0]}; pick a code of its own (ft_launcher's is 93)")
    return out


def build_config(resolved: Resolved, *, script: str | None, script_args: tuple[str, ...] = (),
                 environ: Mapping[str, str], probes: HostProbes = HostProbes(),
                 new_run_id: Callable[[], str] = _fresh_run_id, flags: tuple[str, ...] = ()) -> LaunchConfig:
    """Validate and assemble. ``environ`` is the user's environment, never the process's own; where NVRx versions
    disagree, the values follow the NVRx the workers import (``probes.workers_nvrx``)."""
    found = probes.workers_nvrx(environ)
    resolved = for_workers_nvrx(resolved, found.generation)
    declared, slurm, warnings = _slurm_defaults(resolved, environ)
    v = resolved.values
    if not script:
        raise ConfigError("missing the training script: mbr-launch [OPTIONS] SCRIPT [ARGS...]")
    nodes = parse_nnodes(declared.nnodes)
    nproc = parse_nproc(v["nproc_per_node"], probes.device_count)
    rendezvous, conf_warnings = _rendezvous(v, declared, nodes, slurm, probes, new_run_id)

    shutdown_timeout = v["shutdown_timeout"]
    if shutdown_timeout is None:
        shutdown_timeout = parse_seconds_env("TORCH_ELASTIC_SHUTDOWN_TIMEOUT",
                                             environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "30"))
    ranks_filter = parse_ranks_filter(v["local_ranks_filter"])
    preload = v["standby_preload"]  # None: not given, the level's default list
    if preload and v["standby"] == "off":
        raise ConfigError("--standby-preload needs standbys: drop --standby off (or the preload list)")
    if v["logs_specs"] not in (None, "default"):
        raise ConfigError(f"--logs-specs {v['logs_specs']}: mbr-launch loads no torchrun.logs_specs entry point; it "
                          "writes torchrun's default layout (per-rank stdout.log and stderr.log, chosen by --redirects "
                          "and --tee) under --log-dir: drop --logs-specs or give 'default'")
    scope, when = Scope(v["restart_scope"]), When(v["restart_policy"])
    if when is When.MIN_HEALTHY and scope is not Scope.JOB:
        raise ConfigError(f"--restart-policy {when} leaves a crashed rank lost, --restart-scope {scope} restarts it "
                          "in place: drop one of them")
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
            status_interval=float(v["status_interval"]), keep_runs=v["keep_runs"],
            line_prefix_template=v["log_line_prefix_template"]),
        ft=ft_spec(resolved),
        monitor=MonitorSpec(enabled=v["rank_monitor"] == "on", stack_dump=v["stack_dump"],
                            hang_kill_grace=v["hang_kill_grace"], inquiry_timeout=v["hang_inquiry_timeout"]),
        policy=RestartPolicy(scope=scope, max_restarts=v["max_restarts"],
                             max_startup_restarts=v["max_startup_restarts"],
                             no_restart_exit_codes=v["no_restart_exit_codes"],
                             max_node_failures=v["max_node_failures"], backoff=v["restart_backoff"],
                             backoff_max=v["restart_backoff_max"], crash_loop_window=v["crash_loop_window"],
                             min_nodes=rendezvous.min_nodes, when=when),
        preemption=PreemptionSpec(
            signals=v["preempt_signals"], forward_signal=v["preempt_forward_signal"],
            grace=float(v["preempt_grace"] if v["preempt_grace"] is not None else shutdown_timeout),
            requeue=v["requeue_on_preemption"], max_requeues=v["max_requeues"]),
        standby=_standby(resolved, preload, script, probes),
        telemetry=TelemetrySpec(
            autobeat=v["autobeat"] == "on", initial_step_timeout=v["initial_step_timeout"],
            step_timeout=v["step_timeout"], straggler_threshold=v["straggler_threshold"],
            straggler_interval=v["straggler_interval"], stop_on_straggler=bool(v["stop_on_straggler"])),
        preflight=preflight_spec(resolved, script=script, script_args=tuple(script_args), flags=flags),
        slurm=slurm, warnings=(*warnings, *conf_warnings, *nvrx_warnings(resolved, found)),
        nvrx=nvrx_spec(resolved, found=found, nodes=(rendezvous.min_nodes, rendezvous.max_nodes),
                       run_id=rendezvous.run_id, environ=environ),
    )
