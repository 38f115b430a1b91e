"""Strict loader for the resiliency settings of a Megatron-Bridge style YAML config (``megatron/bridge/
training/config.py``). A misspelt key is the classic silent failure: unknown keys are errors in the resiliency
sections; in ``train``, ``checkpoint`` and ``dist`` only near misses are, other keys are "not checked" infos.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from mbr_launch.config.errors import ConfigError
from mbr_launch.config.files import (BRIDGE_IGNORED_KEYS, BRIDGE_LOOSE_SECTIONS, BRIDGE_OTHER_SECTIONS,
                                     BRIDGE_STRICT_SECTIONS, OWN_SECTIONS, find_fault_tolerance, read_yaml)


class BridgeConfigError(Exception):
    """The file cannot be read or is not a mapping of sections; the message quotes the problem."""


@dataclass(frozen=True)
class KeyProblem:
    path: str  # dotted, e.g. "ft.enable_ft_pakage"
    severity: Literal["error", "info"]
    message: str


@dataclass(frozen=True)
class FaultTolerance:
    enable_ft_package: bool = False
    calc_ft_timeouts: bool = False
    simulate_fault: bool = False
    simulated_fault_type: str = "random"
    simulated_fault_rank: int | None = None
    simulated_fault_base_delay: int = 0


@dataclass(frozen=True)
class NvrxStraggler:
    enabled: bool = False
    report_time_interval: float = 300.0
    calc_relative_gpu_perf: bool = True
    calc_individual_gpu_perf: bool = True
    num_gpu_perf_scores_to_print: int = 5
    gpu_relative_perf_threshold: float = 0.7
    gpu_individual_perf_threshold: float = 0.7
    stop_if_detected: bool = False
    enable_logging: bool = True
    profiling_interval: int = 1
    logger_name: str = "megatron.bridge.NVRxStragglerDetection"


@dataclass(frozen=True)
class LegacyStraggler:
    log_straggler: bool = False
    straggler_ctrlr_port: int = 65535
    straggler_minmax_count: int = 1
    disable_straggler_on_startup: bool = False
    enable_straggler_on_startup: bool = True


@dataclass(frozen=True)
class InProcessRestart:
    enabled: bool = False
    max_iterations: int | None = None
    monitor_thread_interval: float = 1.0
    monitor_process_interval: float = 1.0
    progress_watchdog_interval: float = 1.0
    heartbeat_interval: float = 30.0
    soft_timeout: float = 60.0
    hard_timeout: float = 90.0
    heartbeat_timeout: float = 60.0
    barrier_timeout: float = 120.0
    completion_timeout: float = 120.0
    last_call_wait: float = 1.0
    termination_grace_time: float = 1.0
    granularity: str = "node"
    active_world_size: int | None = None
    empty_cuda_cache: bool = True
    max_rank_faults: int | None = None
    monitor_process_logdir: str | None = None


@dataclass(frozen=True)
class RerunStateMachine:
    rerun_mode: str = "disabled"
    check_for_nan_in_loss: bool = True
    check_for_spiky_loss: bool = False
    spiky_loss_factor: float = 10.0
    error_injection_rate: int = 0
    error_injection_type: str = "transient_error"


@dataclass(frozen=True)
class Checkpoint:
    async_save: bool = False
    ckpt_format: str = "torch_dist"  # Megatron-Bridge's default
    async_strategy: str = "nvrx"
    save: str | None = None
    non_persistent_ckpt_type: str | None = None
    non_persistent_local_ckpt_dir: str | None = None
    non_persistent_local_ckpt_algo: str = "fully_parallel"
    non_persistent_save_interval: int | None = None
    non_persistent_global_ckpt_dir: str | None = None


@dataclass(frozen=True)
class Train:
    exit_signal_handler: bool = False
    exit_signal: str | int = "SIGTERM"
    exit_signal_handler_for_dataloader: bool = False


@dataclass(frozen=True)
class Dist:
    distributed_timeout_minutes: float = 10.0  # Megatron's default
    distributed_backend: str = "nccl"


@dataclass(frozen=True)
class BridgeConfig:
    path: str
    ft: FaultTolerance | None = None
    nvrx_straggler: NvrxStraggler | None = None
    straggler: LegacyStraggler | None = None
    inprocess_restart: InProcessRestart | None = None
    rerun_state_machine: RerunStateMachine = field(default_factory=RerunStateMachine)
    checkpoint: Checkpoint = field(default_factory=Checkpoint)
    train: Train = field(default_factory=Train)
    dist: Dist = field(default_factory=Dist)
    declared_dist_timeout: bool = False  # dist.distributed_timeout_minutes was written, not defaulted
    env_vars: Mapping[str, str] = field(default_factory=dict)
    problems: tuple[KeyProblem, ...] = ()


_STRICT: dict[str, type] = {"ft": FaultTolerance, "nvrx_straggler": NvrxStraggler, "straggler": LegacyStraggler,
                            "inprocess_restart": InProcessRestart, "rerun_state_machine": RerunStateMachine}
_LOOSE: dict[str, type] = {"checkpoint": Checkpoint, "train": Train, "dist": Dist}
# The section names are declared in config.files (its loader must accept them); the types above must match.
assert frozenset(_STRICT) == BRIDGE_STRICT_SECTIONS and frozenset(_LOOSE) == BRIDGE_LOOSE_SECTIONS
# Not about resiliency, so not inspected; plus our own sections of the file (checked by config.files).
_OTHER_SECTIONS = BRIDGE_OTHER_SECTIONS | OWN_SECTIONS
_TYPES: dict[str, tuple[type, ...]] = {"bool": (bool,), "int": (int,), "float": (int, float), "str": (str,),
                                       "None": (type(None),)}


def load(path: str | Path) -> BridgeConfig:
    p = Path(path)
    try:
        raw = read_yaml(str(p))  # a FIFO, a device, a huge or binary file: one line, never a hang
    except ConfigError as exc:
        raise BridgeConfigError(str(exc)) from exc
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise BridgeConfigError(f"{p}: expected a mapping of sections at the top level, got {type(raw).__name__}")
    return parse(raw, path=str(p))


def parse(raw: Mapping[str, Any], *, path: str = "<config>") -> BridgeConfig:
    problems: list[KeyProblem] = []
    sections: dict[str, Any] = {}
    known_top = set(_STRICT) | set(_LOOSE) | _OTHER_SECTIONS
    # A training config carrying ft_launcher's section (at any depth) has sections of its own: infos, not errors.
    carried = find_fault_tolerance(raw) is not None
    for key, value in raw.items():
        key = str(key)
        if key in BRIDGE_IGNORED_KEYS or key in _OTHER_SECTIONS:
            continue
        if key not in known_top:
            if carried:
                problems.append(KeyProblem(key, "info", "not a Megatron-Bridge section (the file carries "
                                                        "ft_launcher's fault_tolerance section); not checked"))
            else:
                problems.append(KeyProblem(key, "error", _unknown(key, known_top)))
            continue
        if value is None:
            continue  # "ft: null" means the section is off, as in ConfigContainer
        if not isinstance(value, Mapping):
            problems.append(KeyProblem(key, "error", f"expected a mapping, got {type(value).__name__} {value!r}"))
            continue
        cls = _STRICT.get(key) or _LOOSE[key]
        sections[key] = _build(cls, value, key, strict=key in _STRICT, problems=problems)
    env_vars = raw.get("env_vars") or {}
    if not isinstance(env_vars, Mapping):
        problems.append(KeyProblem("env_vars", "error", "expected a mapping of NAME: value"))
        env_vars = {}
    dist_raw = raw.get("dist")
    return BridgeConfig(
        path=path,
        **sections,
        declared_dist_timeout=isinstance(dist_raw, Mapping) and "distributed_timeout_minutes" in dist_raw,
        # Bridge applies env_vars with str(); YAML booleans would become "True", which is what torch sees.
        env_vars={str(k): str(v) for k, v in env_vars.items()},
        problems=tuple(problems),
    )


def _build(cls: type, raw: Mapping[str, Any], section: str, *, strict: bool, problems: list[KeyProblem]) -> Any:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in raw.items():
        key = str(key)
        where = f"{section}.{key}"
        if key in BRIDGE_IGNORED_KEYS:
            continue
        if key not in fields:
            close = difflib.get_close_matches(key, fields, n=1, cutoff=0.8)
            if strict or close:
                problems.append(KeyProblem(where, "error", _unknown(key, fields)))
            else:
                problems.append(KeyProblem(where, "info", "not a resiliency setting; not checked by doctor"))
            continue
        expected = str(fields[key].type)
        if not _type_ok(value, expected):
            problems.append(KeyProblem(where, "error", f"expected {expected}, got {type(value).__name__} {value!r}"))
            continue
        kwargs[key] = value
    return cls(**kwargs)


def _type_ok(value: object, expected: str) -> bool:
    allowed: tuple[type, ...] = ()
    for name in expected.split("|"):
        allowed += _TYPES.get(name.strip(), (object,))
    if isinstance(value, bool) and bool not in allowed:
        return False  # bool is an int subclass; "hard_timeout: true" is a mistake, not 1 second
    return isinstance(value, allowed)


def _unknown(key: str, known: Any) -> str:
    close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]}?" if close else f"; known: {', '.join(sorted(known))}"
    return "unknown key" + hint
