"""The two specs ft_launcher's settings become, built and checked: what NVRx clients read (``FaultToleranceSpec``)
and what ft_launcher 0.6/0.7's launcher features mean here (``NvrxLauncherSpec``). Part of ``config.build``.

The values arrive already read as the workers' NVRx reads them (``settings.for_workers_nvrx``). What can be wrong
across settings (a segment that does not divide MIN nodes) is one ``ConfigError``; what is odd but workable (an exit
code a shell sees modulo 256, a boolean word no version lists) is a warning the agent prints at start.
"""

from __future__ import annotations

from typing import Any, Mapping

from mbr_launch.config.errors import ConfigError
from mbr_launch.config.ftparse import unclear
from mbr_launch.config.model import FaultToleranceSpec, NvrxLauncherSpec
from mbr_launch.config.nvrx import ALL_FT_FIELDS, NvrxFound
from mbr_launch.config.settings import BY_NAME, SETTINGS, Resolved
from mbr_launch.report import exitcodes

# The launcher's own exit codes (report.exitcodes): a no-restart code equal to one of them cannot be told apart.
_OWN_CODES = {code: text for code, text in exitcodes.TABLE if isinstance(code, int)}


def _or_default(v: Mapping[str, Any], name: str) -> Any:
    """A value that ft_launcher 0.6+ lets be none ('none' keeps the default here)."""
    value = v[name]
    return BY_NAME[name].default if value is None else value


def user_set(resolved: Resolved) -> tuple[str, ...]:
    """The FaultToleranceConfig fields whose value the user gave, sorted."""
    return tuple(sorted(s.ft_key for s in SETTINGS
                        if s.ft_key in ALL_FT_FIELDS and resolved.given(s.name)))  # type: ignore[misc]


def ft_spec(resolved: Resolved) -> FaultToleranceSpec:
    v = resolved.values
    paths = v["storage_health_check_path"]
    return FaultToleranceSpec(
        initial_rank_heartbeat_timeout=v["initial_heartbeat_timeout"], rank_heartbeat_timeout=v["heartbeat_timeout"],
        rank_section_timeouts=v["section_timeouts"], rank_out_of_section_timeout=v["out_of_section_timeout"],
        workload_check_interval=_or_default(v, "workload_check_interval"),
        safety_factor=_or_default(v, "safety_factor"), rank_termination_signal=v["rank_termination_signal"],
        log_level=v["ft_log_level"], node_health_check_interval=_or_default(v, "node_health_check_interval"),
        restart_check_interval=_or_default(v, "restart_check_interval"), enable_nic_monitor=v["enable_nic_monitor"],
        pci_topo_file=v["pci_topo_file"], link_down_path_template=v["link_down_path_template"],
        enable_nic_healthcheck=v["enable_nic_healthcheck"],
        enable_dist_storage_healthcheck=v["enable_dist_storage_healthcheck"],
        storage_healthcheck_path=",".join(paths) if paths else None,
        link_state_path_template=v["link_state_path_template"], skip_section_response=v["skip_section_response"],
        segment=v["segment"], numa_bind_strict=v["numa_bind_strict"],
        gpu_memory_reclaim_timeout=v["gpu_memory_reclaim_timeout"] or 0.0,
        gpu_memory_tolerance_mb=_or_default(v, "gpu_memory_tolerance_mb"),
        gpu_memory_poll_interval=_or_default(v, "gpu_memory_poll_interval"),
        check_remaining_processes=v["check_remaining_processes"], max_no_progress_cycles=v["max_no_progress_cycles"],
        min_progress_iterations=v["min_progress_iterations"], checkpoint_iteration_file=v["checkpoint_iteration_file"],
        install_exception_hook=v["install_exception_hook"], num_warmup_iterations=v["num_warmup_iterations"],
        attribution_endpoint=v["attribution_endpoint"],
        attribution_stop_action=v["attribution_stop_action"] if resolved.given("attribution_stop_action") else None,
        attribution_export_url=v["attribution_export_url"], cycle_info_dir=v["cycle_info_dir"],
        segment_health_check_dir=v["segment_health_check_dir"], user_set=user_set(resolved))


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
    return NvrxLauncherSpec(
        workers_nvrx=found.version, attribution_stop_action=v["attribution_stop_action"] or "log",
        max_no_progress_cycles=v["max_no_progress_cycles"], min_progress_iterations=v["min_progress_iterations"],
        checkpoint_iteration_file=v["checkpoint_iteration_file"],
        no_restart_exit_code=v["no_restart_exit_code"] & 0xFF,
        cycle_info_dir=v["cycle_info_dir"], cycle_info_job_id=job_id,
        per_cycle_applog_prefix=v["per_cycle_applog_prefix"],
        enable_nic_healthcheck=v["enable_nic_healthcheck"], link_state_path_template=v["link_state_path_template"],
        enable_dist_storage_healthcheck=v["enable_dist_storage_healthcheck"],
        storage_healthcheck_paths=tuple(v["storage_health_check_path"] or ()),
        node_health_check_endpoint=v["node_health_check_endpoint"],
        segment_health_check_dir=v["segment_health_check_dir"], segment=segment,
        gpu_memory_reclaim_timeout=float(v["gpu_memory_reclaim_timeout"] or 0.0),
        gpu_memory_tolerance_mb=float(_or_default(v, "gpu_memory_tolerance_mb")),
        gpu_memory_poll_interval=float(_or_default(v, "gpu_memory_poll_interval")),
        check_remaining_processes=v["check_remaining_processes"], numa_bind_strict=v["numa_bind_strict"])


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


__all__ = ["ft_spec", "nvrx_spec", "nvrx_warnings", "user_set"]
