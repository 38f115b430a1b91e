"""What mbr-launch knows about the NVRx versions it follows: 0.4.1, 0.6.0 and 0.7.0.

Where ft_launcher's versions disagree, mbr-launch follows the NVRx in the workers' environment
(``config.host.workers_nvrx``); ``tests/test_ft_flag_parity.py`` checks these tables against the real packages."""

from __future__ import annotations

import re
from dataclasses import dataclass

# The lines whose behaviour mbr-launch knows, oldest first. 0.5 behaves as 0.4.1 here: every change that matters to
# a launcher happened between 0.4.1 and 0.6.0. A version newer than the last is taken as the last.
GENERATIONS = ("0.4", "0.6", "0.7")
NEWEST = GENERATIONS[-1]
NAMES = {"0.4": "0.4.1", "0.6": "0.6", "0.7": "0.7"}  # a line as people call it ("ft_launcher 0.4.1's defaults")

# FaultToleranceConfig's fields in each line, in declaration order: the YAML ``fault_tolerance:`` keys and what a
# client reads from the config the rank monitor returns.
_FIELDS_04 = ("workload_check_interval", "initial_rank_heartbeat_timeout", "rank_heartbeat_timeout",
              "rank_section_timeouts", "rank_out_of_section_timeout", "node_health_check_interval", "safety_factor",
              "rank_termination_signal", "log_level", "restart_check_interval", "enable_nic_monitor")
_FIELDS_06 = (*_FIELDS_04, "enable_nic_healthcheck", "enable_dist_storage_healthcheck", "storage_healthcheck_path",
              "pci_topo_file", "link_down_path_template", "link_state_path_template", "skip_section_response",
              "segment", "numa_bind_strict", "gpu_memory_reclaim_timeout", "gpu_memory_tolerance_mb",
              "gpu_memory_poll_interval", "check_remaining_processes", "max_no_progress_cycles",
              "min_progress_iterations", "checkpoint_iteration_file", "install_exception_hook",
              "num_warmup_iterations", "attribution_endpoint")
FT_FIELDS: dict[str, tuple[str, ...]] = {
    "0.4": (*_FIELDS_04, "pci_topo_file", "link_down_path_template"),
    "0.6": (*_FIELDS_06, "cycle_info_dir"),
    "0.7": (*_FIELDS_06, "attribution_stop_action", "attribution_export_url", "cycle_info_dir",
            "segment_health_check_dir"),
}
ALL_FT_FIELDS = frozenset(f for fields in FT_FIELDS.values() for f in fields)
# Fields of 0.6+ that the client itself reads (the others are the launcher's, which mbr-launch is): set for an
# NVRx 0.4.1 client, they have no effect.
CLIENT_FIELDS_SINCE_06 = ("skip_section_response", "install_exception_hook", "num_warmup_iterations")

# ft_launcher 0.6 dropped these 0.4.1 spellings (and every --ft-param-* / --ft_param_* one); 0.7 dropped one of 0.6.
REMOVED_IN_06 = frozenset({"--fault-tol-cfg-path", "--restart-policy", "--restart_policy",
                           "--ignore-missing-fault-tol-cfg"})
REMOVED_IN_07 = frozenset({"--ft-attribution-compute-timeout", "--ft_attribution_compute_timeout"})
# (setting, value) -> the line that stopped taking that value.
REMOVED_VALUES: dict[tuple[str, str], str] = {
    ("restart_policy", "min-healthy"): "0.6", ("rdzv_impl", "legacy"): "0.7",
    ("attribution_analysis_backend", "mcp"): "0.7",
}


def generation(version: str | None) -> str | None:
    """The line of an NVRx ``version`` ("0.7.0rc1" -> "0.7"); None when there is none or it cannot be read."""
    if not version:
        return None
    match = re.match(r"(\d+)\.(\d+)", version.strip())
    if match is None:
        return None
    found = (int(match.group(1)), int(match.group(2)))
    line = GENERATIONS[0]
    for candidate in GENERATIONS:
        if found >= release(candidate):
            line = candidate
    return line


def release(line: str) -> tuple[int, ...]:
    return tuple(int(part) for part in line.split("."))


def removed_spelling(flag: str) -> str | None:
    """The ft_launcher line that no longer has ``flag``, or None."""
    if flag.startswith(("--ft-param-", "--ft_param_")) or flag in REMOVED_IN_06:
        return "0.6"
    return "0.7" if flag in REMOVED_IN_07 else None


@dataclass(frozen=True)
class NvrxFound:
    """The NVRx a worker would import (None: not installed), where its metadata is, and how that is on the path."""

    version: str | None
    where: str = ""
    via: str = ""

    @property
    def generation(self) -> str | None:
        return generation(self.version)

    def describe(self) -> str:
        if self.version is None:
            return "no nvidia-resiliency-ext in the workers' environment"
        return f"nvidia-resiliency-ext {self.version} ({self.where}, on {self.via})"
