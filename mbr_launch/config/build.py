"""The validated launch configuration, built once from resolved settings.

``build_config`` is where bad input becomes one clear ``ConfigError`` (exit code 2): every check that can
be made before a single process starts is made here.
"""

from __future__ import annotations

import os
import shutil
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from mbr_launch.contract import BOOT_MODULE
from mbr_launch.config.settings import BY_FT_KEY, BY_NAME, Resolved, SettingError
from mbr_launch.decide.policy import RestartPolicy
from mbr_launch.config.slurm import SlurmEnv, SlurmError


class ConfigError(ValueError):
    """Bad input: the message says what is wrong and what to do."""


@dataclass(frozen=True)
class StdSpec:
    """torchrun's -r/-t value: which streams of which local ranks (1 stdout, 2 stderr, 3 both)."""

    default: int = 0
    per_rank: Mapping[int, int] = field(default_factory=dict)

    def for_rank(self, local_rank: int) -> int:
        return self.per_rank.get(local_rank, self.default)

    @staticmethod
    def parse(flag: str, text: str) -> "StdSpec":
        text = text.strip()
        try:
            if ":" not in text:
                value = int(text or "0")
                if value not in (0, 1, 2, 3):
                    raise ValueError
                return StdSpec(default=value)
            per_rank = {}
            for part in text.split(","):
                rank, _, value = part.partition(":")
                if int(value) not in (0, 1, 2, 3):
                    raise ValueError
                per_rank[int(rank)] = int(value)
            return StdSpec(per_rank=per_rank)
        except ValueError:
            raise ConfigError(f"{flag}: expected 0-3 or LOCAL_RANK:0-3,... (got {text!r})") from None


@dataclass(frozen=True)
class FaultToleranceSpec:
    """What the rank monitor enforces, in NVRx FaultToleranceConfig field names."""

    initial_rank_heartbeat_timeout: float | None
    rank_heartbeat_timeout: float | None
    rank_section_timeouts: Mapping[str, float | None]
    rank_out_of_section_timeout: float | None
    workload_check_interval: float
    safety_factor: float
    rank_termination_signal: str
    log_level: str
    node_health_check_interval: float
    restart_check_interval: float
    enable_nic_monitor: bool
    pci_topo_file: str | None
    link_down_path_template: str | None

    def as_nvrx_dict(self) -> dict[str, Any]:
        import logging

        data = dict(self.__dict__)
        data["rank_section_timeouts"] = dict(self.rank_section_timeouts)
        data["log_level"] = logging.getLevelName(self.log_level)
        return data


@dataclass(frozen=True)
class LaunchConfig:
    min_nodes: int
    max_nodes: int
    nproc_per_node: int
    rdzv_backend: str
    rdzv_endpoint: str
    run_id: str
    rdzv_configs: Mapping[str, Any]
    rdzv_timeout: float
    standalone: bool
    node_rank: int
    local_addr: str | None
    role: str
    max_restarts: int
    monitor_interval: float
    shutdown_timeout: float
    signals_to_handle: tuple[str, ...]
    entrypoint: tuple[str, ...]  # argv of one worker, before per-rank env
    training_script: str
    training_script_args: tuple[str, ...]
    use_boot: bool  # run through mbr_launch.shim.boot (False with --no-python)
    log_dir: str | None
    redirects: StdSpec
    tee: StdSpec
    local_ranks_filter: frozenset[int] | None
    duplicate_stdout_filters: tuple[str, ...]
    duplicate_stderr_filters: tuple[str, ...]
    virtual_local_rank: bool
    omp_num_threads: str | None  # set in workers when the user did not set it
    ft: FaultToleranceSpec
    rank_monitor: bool
    stack_dump: str
    hang_kill_grace: float
    no_restart_exit_codes: tuple[int, ...]
    quiet: bool
    slurm: "SlurmEnv | None"
    preempt_signals: tuple[str, ...]
    preempt_forward_signal: str
    preempt_grace: float
    requeue_on_preemption: bool
    max_requeues: int | None
    settings: Resolved
    policy: "RestartPolicy" = None  # type: ignore[assignment]
    peer_timeout: float = 15.0
    warnings: tuple[str, ...] = ()


# ---- config file ---------------------------------------------------------------------------------


def load_config_file(path: str) -> dict[str, Any]:
    """Read our YAML file: an ``mbr_launch:`` section of settings and/or ``fault_tolerance:`` as ft_launcher
    writes it. Unknown keys are errors that name the key."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"--config: file {path} does not exist") from None
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"--config: cannot read {path}: {err}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"--config: {path} must hold a mapping with 'mbr_launch:' and/or 'fault_tolerance:'")
    values: dict[str, Any] = {}
    for key, section in data.items():
        if key not in ("mbr_launch", "fault_tolerance"):
            if key in _bridge_sections():
                continue  # Megatron-Bridge resiliency settings: checked by the doctor preflight
            raise ConfigError(f"--config: unknown top-level key {key!r} in {path}; expected 'mbr_launch', "
                              "'fault_tolerance' or a Megatron-Bridge section (ft, inprocess_restart, ...)")
        if section is None:
            continue
        if not isinstance(section, dict):
            raise ConfigError(f"--config: '{key}' in {path} must be a mapping")
        table = BY_NAME if key == "mbr_launch" else BY_FT_KEY
        for name, value in section.items():
            setting = table.get(str(name).replace("-", "_"))
            if setting is None or setting.name == "config":
                raise ConfigError(f"--config: unknown key '{key}.{name}' in {path}")
            values[setting.name] = value
    return values


def _bridge_sections() -> frozenset[str]:
    from mbr_launch.doctor.mbridge import known_sections

    return known_sections()


# ---- building ------------------------------------------------------------------------------------


def parse_nnodes(text: str) -> tuple[int, int]:
    parts = text.split(":")
    try:
        if len(parts) == 1:
            low = high = int(parts[0])
        elif len(parts) == 2:
            low, high = int(parts[0]), int(parts[1])
        else:
            raise ValueError
    except ValueError:
        raise ConfigError(f"--nnodes: expected N or MIN:MAX with integers (got {text!r})") from None
    if not 0 < low <= high:
        raise ConfigError(f"--nnodes: need 0 < MIN <= MAX (got {text!r})")
    return low, high


def parse_nproc(text: str) -> int:
    text = text.strip()
    if text.isdigit() and int(text) > 0:
        return int(text)
    if text in ("cpu", "auto", "gpu", "xpu"):
        count = _device_count(text)
        if count < 1:
            raise ConfigError(f"--nproc-per-node {text}: no {text} devices found on this machine")
        return count
    raise ConfigError(f"--nproc-per-node: expected a positive integer, auto, cpu, gpu or xpu (got {text!r})")


def _device_count(kind: str) -> int:
    if kind == "cpu":
        return os.cpu_count() or 1
    import torch

    if kind == "gpu":
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    if kind == "xpu":
        return torch.xpu.device_count() if hasattr(torch, "xpu") and torch.xpu.is_available() else 0
    if torch.cuda.is_available():
        return torch.cuda.device_count()
    return os.cpu_count() or 1


def parse_rdzv_conf(text: str) -> dict[str, Any]:
    conf: dict[str, Any] = {}
    for part in [p for p in text.split(",") if p.strip()]:
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--rdzv-conf: expected KEY=VALUE,... (got {text!r})")
        conf[key.strip()] = value.strip()
    return conf


def _port_of(endpoint: str) -> tuple[str, int | None]:
    host, sep, port = endpoint.rpartition(":")
    if not sep:
        return endpoint, None
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"--rdzv-endpoint: bad port in {endpoint!r}; expected HOST:PORT")
    return host.strip("[]"), int(port)


def _port_taken(host: str, port: int) -> bool:
    """True when nothing of ours could bind the port on this host (someone else listens on it)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host if host not in ("localhost",) else "127.0.0.1", port))
        except OSError:
            return True
    return False


def _is_local_host(host: str) -> bool:
    if host in ("localhost", "127.0.0.1", "::1", "", socket.gethostname(), socket.getfqdn()):
        return True
    try:
        return socket.gethostbyname(host).startswith("127.")
    except OSError:
        return False


def _resolve_entrypoint(script: str, module: bool, no_python: bool, run_path: bool) -> tuple[tuple[str, ...], bool]:
    import sys

    python = os.environ.get("PYTHON_EXEC", sys.executable)
    if run_path or not (module or no_python):
        if not Path(script).is_file():
            raise ConfigError(f"training script {script} does not exist; check the path "
                              "(or pass -m for a module)")
        return (python, "-u", "-m", BOOT_MODULE, script), True
    if module:
        return (python, "-u", "-m", BOOT_MODULE, "-m", script), True
    # --no-python: the script is a program of its own
    if shutil.which(script) is None and not Path(script).is_file():
        raise ConfigError(f"program {script} (--no-python) was not found on PATH")
    return (script,), False


def _slurm_defaults(resolved: Resolved, environ: Mapping[str, str]) -> tuple[dict[str, Any], SlurmEnv | None,
                                                                            list[str]]:
    """Values derived from the Slurm step for the settings the user left at their defaults."""
    v = dict(resolved.values)
    if v["slurm"] == "off" or v["standalone"]:
        return v, None, []
    try:
        slurm = SlurmEnv.from_environ(environ)
    except SlurmError as err:
        raise ConfigError(str(err)) from None
    if slurm is None:
        if v["slurm"] == "on":
            raise ConfigError("--slurm on: this is not a Slurm job (SLURM_JOB_ID is not set)")
        return v, None, []
    problem = slurm.check_one_launcher_per_node()
    if problem:
        raise ConfigError(problem)
    warnings = [w for w in (slurm.kill_on_bad_exit_warning(),) if w]
    def untouched(name: str) -> bool:
        return resolved.sources.get(name) == "default"

    if untouched("nnodes"):
        v["nnodes"] = str(slurm.nnodes())
    if untouched("rdzv_backend"):
        v["rdzv_backend"] = "c10d"
    if untouched("rdzv_id"):
        v["rdzv_id"] = slurm.run_id()
    if untouched("rdzv_endpoint") and v["rdzv_backend"] == "c10d":
        port = v["slurm_rdzv_port"] or _slurm_port(slurm)
        v["rdzv_endpoint"] = slurm.rdzv_endpoint(port)
    if untouched("node_rank") and slurm.node_id is not None:
        v["node_rank"] = slurm.node_rank()
    return v, slurm, warnings


def _slurm_port(slurm: SlurmEnv) -> int:
    # Every node computes the same port; different jobs (and steps, and requeues) get different ones.
    import zlib

    key = f"{slurm.job_id}.{slurm.step_id}.{slurm.restart_count}".encode()
    return 20000 + zlib.crc32(key) % 20000


def build_config(resolved: Resolved, *, script: str | None, script_args: tuple[str, ...],
                 environ: Mapping[str, str]) -> LaunchConfig:
    v, slurm, warnings = _slurm_defaults(resolved, environ)
    if not script:
        raise ConfigError("missing the training script: mbr-launch [OPTIONS] SCRIPT [ARGS...]")
    min_nodes, max_nodes = parse_nnodes(v["nnodes"])
    nproc = parse_nproc(v["nproc_per_node"])
    rdzv_conf = parse_rdzv_conf(v["rdzv_conf"])

    backend, endpoint, run_id = v["rdzv_backend"], v["rdzv_endpoint"], v["rdzv_id"]
    standalone = bool(v["standalone"])
    if standalone:
        backend, endpoint, run_id = "c10d", "localhost:0", _fresh_run_id()
        if max_nodes > 1:
            raise ConfigError("--standalone runs one node; drop --standalone or use --nnodes 1")
    elif backend == "static" and max_nodes == 1 and v["master_port"] is None and not endpoint:
        # torchrun's rule: a single static node with no port becomes a private c10d rendezvous.
        backend, endpoint, run_id, standalone = "c10d", "localhost:0", _fresh_run_id(), True
    if backend not in ("c10d", "static"):
        raise ConfigError(f"--rdzv-backend {backend}: only c10d and static are supported "
                          "(etcd is deprecated in torch)")
    if backend == "static":
        if min_nodes != max_nodes:
            raise ConfigError("--rdzv-backend static needs a fixed --nnodes N; use c10d for MIN:MAX")
        if not endpoint:
            endpoint = f"{v['master_addr']}:{v['master_port'] if v['master_port'] is not None else 29500}"
        rdzv_conf["rank"] = v["node_rank"]
        if v["node_rank"] >= max_nodes:
            raise ConfigError(f"--node-rank {v['node_rank']} must be below --nnodes {max_nodes}")
    if not endpoint:
        raise ConfigError("--rdzv-endpoint is required for a multi-node c10d rendezvous (HOST:PORT); "
                          "use --standalone for one node")
    host, port = _port_of(endpoint)
    if backend == "c10d" and port is None:
        endpoint, port = f"{endpoint}:29400", 29400
    if port and _is_local_host(host) and _port_taken(host or "127.0.0.1", port):
        if backend == "static" and v["node_rank"] == 0:
            raise ConfigError(f"port {port} on {host} is already in use: rank 0 must host the store there; "
                              "pick a free --master-port")
        if backend == "c10d" and max_nodes == 1 and slurm is None and not _listener_is_launcher(port):
            raise ConfigError(f"port {port} on {host} is in use by another program; pick a free port "
                              "in --rdzv-endpoint (or use --standalone)")

    shutdown_timeout = v["shutdown_timeout"]
    if shutdown_timeout is None:
        raw = environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "30")
        try:
            shutdown_timeout = float(raw)
        except ValueError:
            raise ConfigError(f"TORCH_ELASTIC_SHUTDOWN_TIMEOUT={raw!r} is not a number of seconds") from None

    ranks_filter = None
    if v["local_ranks_filter"]:
        try:
            ranks_filter = frozenset(int(r) for r in v["local_ranks_filter"].split(","))
        except ValueError:
            raise ConfigError("--local-ranks-filter: expected local ranks like 0,1,2 "
                              f"(got {v['local_ranks_filter']!r})") from None

    if v["standby_preload"] and v["standby"] == "off":
        raise ConfigError("--standby-preload needs standbys: drop --standby off (or the preload list)")

    if v["logs_specs"] is not None:
        raise ConfigError("--logs-specs is not supported: mbr-launch writes its own log layout under --log-dir")
    if v["log_dir"] is not None and Path(v["log_dir"]).exists() and not Path(v["log_dir"]).is_dir():
        raise ConfigError(f"--log-dir {v['log_dir']} exists and is not a directory")

    entrypoint, use_boot = _resolve_entrypoint(script, v["module"], v["no_python"], v["run_path"])
    ft = FaultToleranceSpec(
        initial_rank_heartbeat_timeout=v["initial_heartbeat_timeout"],
        rank_heartbeat_timeout=v["heartbeat_timeout"],
        rank_section_timeouts=v["section_timeouts"],
        rank_out_of_section_timeout=v["out_of_section_timeout"],
        workload_check_interval=v["workload_check_interval"],
        safety_factor=v["safety_factor"],
        rank_termination_signal=v["rank_termination_signal"],
        log_level=v["ft_log_level"],
        node_health_check_interval=v["node_health_check_interval"],
        restart_check_interval=v["restart_check_interval"],
        enable_nic_monitor=v["enable_nic_monitor"],
        pci_topo_file=v["pci_topo_file"],
        link_down_path_template=v["link_down_path_template"],
    )
    return LaunchConfig(
        min_nodes=min_nodes, max_nodes=max_nodes, nproc_per_node=nproc,
        rdzv_backend=backend, rdzv_endpoint=endpoint, run_id=run_id, rdzv_configs=rdzv_conf,
        rdzv_timeout=float(rdzv_conf.get("join_timeout", 600)), standalone=standalone,
        node_rank=v["node_rank"], local_addr=v["local_addr"], role=v["role"],
        max_restarts=v["max_restarts"], monitor_interval=v["monitor_interval"],
        shutdown_timeout=float(shutdown_timeout), signals_to_handle=v["signals_to_handle"],
        entrypoint=entrypoint, training_script=script, training_script_args=tuple(script_args),
        use_boot=use_boot, log_dir=v["log_dir"],
        redirects=StdSpec.parse("--redirects", v["redirects"]), tee=StdSpec.parse("--tee", v["tee"]),
        local_ranks_filter=ranks_filter,
        duplicate_stdout_filters=v["duplicate_stdout_filters"],
        duplicate_stderr_filters=v["duplicate_stderr_filters"],
        virtual_local_rank=v["virtual_local_rank"],
        omp_num_threads="1" if "OMP_NUM_THREADS" not in environ and nproc > 1 else None,
        ft=ft, rank_monitor=v["rank_monitor"] == "on", stack_dump=v["stack_dump"],
        hang_kill_grace=v["hang_kill_grace"], no_restart_exit_codes=v["no_restart_exit_codes"],
        quiet=v["quiet"], slurm=slurm, preempt_signals=v["preempt_signals"],
        preempt_forward_signal=v["preempt_forward_signal"],
        preempt_grace=float(v["preempt_grace"] if v["preempt_grace"] is not None else shutdown_timeout),
        requeue_on_preemption=v["requeue_on_preemption"], max_requeues=v["max_requeues"],
        settings=resolved, warnings=tuple(warnings),
        policy=RestartPolicy(scope=v["restart_scope"], max_restarts=v["max_restarts"],
                             max_startup_restarts=v["max_startup_restarts"],
                             no_restart_exit_codes=v["no_restart_exit_codes"],
                             max_node_failures=v["max_node_failures"], backoff=v["restart_backoff"],
                             backoff_max=v["restart_backoff_max"], crash_loop_window=v["crash_loop_window"],
                             min_nodes=min_nodes),
        peer_timeout=v["peer_timeout"] or 5.0,
    )


def _fresh_run_id() -> str:
    import uuid

    return uuid.uuid4().hex[:12]


def _listener_is_launcher(port: int) -> bool:
    """Whether the process listening on ``port`` is another mbr-launch agent (a legitimate peer)."""
    try:
        import psutil

        for conn in psutil.net_connections(kind="tcp"):
            if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN and conn.pid:
                cmd = " ".join(psutil.Process(conn.pid).cmdline())
                return "mbr_launch" in cmd or "mbr-launch" in cmd
    except Exception:
        return True  # cannot tell: do not refuse a possibly legitimate peer
    return False


__all__ = ["ConfigError", "LaunchConfig", "build_config", "load_config_file", "SettingError", "StdSpec"]
