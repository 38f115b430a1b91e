"""The settings of ft_launcher 0.6 and 0.7's options, declared once (part of ``settings.SETTINGS``).

Each option takes NVRx's spellings and values (``declare.nvrx_setting``). Those with a meaning here feed
``LaunchConfig.nvrx`` (``NvrxLauncherSpec``) and, where they are FaultToleranceConfig fields, the NVRx clients'
config (``FaultToleranceSpec``); those without one are in the ``COMPAT`` panel and their help says, in one line,
what mbr-launch does instead.
"""

from __future__ import annotations

from mbr_launch.config.declare import COMPAT, HEALTH, LOGGING, POLICY, Setting
from mbr_launch.config.declare import nvrx_setting as _nvrx
from mbr_launch.config.ftparse import absolute_path, absolute_paths, folded_choice, ft_bool, integer, optional_number
from mbr_launch.config.parse import choice, non_negative, positive

# What an attribution STOP recommendation does (``--ft-attribution-stop-action``), as mbr-launch's verdict does it.
STOP_LOG, STOP_NO_RESTART = "log", "no-restart"

NVRX_SETTINGS: tuple[Setting, ...] = (
    # -- what the NVRx 0.6+ client reads from the config the rank monitor returns --
    _nvrx("skip_section_response", bool, True,
          "NVRx 0.6+ clients send heartbeats and sections without reading a reply (true, ft_launcher's default); "
          "false makes them wait for each reply. Read as ft_launcher reads it: true only for true/1/yes (and on). "
          "NVRx 0.4.1 clients ignore it.",
          twin="--ft-", field="skip_section_response", parse=ft_bool("--ft-skip-section-response", "truthy"),
          valued=True, metavar="BOOL"),
    _nvrx("install_exception_hook", bool, False,
          "NVRx 0.6+ clients install a sys.excepthook that logs an uncaught exception and exits the rank at once. "
          "Read as ft_launcher reads it: false only for false/0/no (and off). NVRx 0.4.1 clients ignore it.",
          twin="--ft-", field="install_exception_hook", parse=ft_bool("--ft-install-exception-hook", "falsy"),
          valued=True, metavar="BOOL"),
    _nvrx("num_warmup_iterations", int, 5,
          "Steps at the start of each round during which the 'step' section and out-of-section timeouts are not "
          "enforced (a 'warmup' section timeout covers them); NVRx 0.6+ clients may send their own count. A "
          "FaultToleranceConfig field that ft_launcher sets only from YAML.",
          twin="--ft-", field="num_warmup_iterations", parse=non_negative("--ft-num-warmup-iterations", int),
          metavar="N"),
    # -- node health: before a node joins, and between two rounds --
    _nvrx("enable_nic_healthcheck", bool, False,
          "Before joining a round, check that every InfiniBand port that was ACTIVE when the launcher started "
          "still is; a node that fails stays out and says why. Default false, or true when the workers import NVRx "
          "0.6+ (ft_launcher 0.6+'s default). Read as ft_launcher reads it: false only for false/0/no (and off).",
          twin="--ft-", field="enable_nic_healthcheck", parse=ft_bool("--ft-enable-nic-healthcheck", "falsy"),
          valued=True, metavar="BOOL", panel=HEALTH, nvrx_defaults=(("0.6", True),)),
    _nvrx("link_state_path_template", str, None,
          "Where the NIC check reads a port's state; {nic} is the device name (NVRx's default: "
          "/sys/class/infiniband/{nic}/ports/1/state).",
          twin="--ft-", field="link_state_path_template", metavar="TEMPLATE", panel=HEALTH),
    _nvrx("enable_dist_storage_healthcheck", bool, False,
          "Before joining a round, check the Lustre and NFS mounts this node sees (true/false/1/0/yes/no).",
          field="enable_dist_storage_healthcheck", valued=True, metavar="BOOL", panel=HEALTH),
    _nvrx("storage_health_check_path", str, None,
          "Comma-separated absolute paths that must exist and be readable before this node joins a round.",
          option="storage_health_check_path", field="storage_healthcheck_path",
          parse=absolute_paths("--ft-storage-health-check-path"), metavar="PATHS", panel=HEALTH),
    _nvrx("node_health_check_endpoint", str, None,
          "Unix socket of a node health-check daemon (/var/run/nvhcd.sock or unix:///var/run/nvhcd.sock) to ask "
          "before this node joins a round.",
          twin="--ft-", metavar="SOCKET", panel=HEALTH),
    _nvrx("segment_health_check_dir", str, None,
          "Shared directory (absolute) of per-task segment health decisions; a node whose decision says unhealthy "
          "does not join (NVRx 0.7).",
          field="segment_health_check_dir", parse=absolute_path("--ft-segment-health-check-dir"), metavar="DIR",
          panel=HEALTH),
    _nvrx("segment", int, None,
          "With --nnodes MIN:MAX: pick active nodes in whole NVLink domains of this many nodes (GPU ClusterUUID); "
          "MIN must be a multiple of it. Default: any MIN nodes.",
          field="segment", parse=positive("--ft-segment", int), metavar="N", panel=HEALTH),
    _nvrx("gpu_memory_reclaim_timeout", float, 0.0,
          "Before restarting workers, wait up to this many seconds for the memory the stopped workers still hold "
          "on their GPUs (NVML's per-process view; where it has none, for used memory below "
          "--ft-gpu-memory-tolerance-mb); other processes' memory is named, not waited for (0 or none: do not "
          "wait). Default 0, or 50 when the workers import NVRx 0.6+ (ft_launcher 0.6+'s default).",
          twin="--ft-", field="gpu_memory_reclaim_timeout", parse=optional_number("--ft-gpu-memory-reclaim-timeout"),
          metavar="SECONDS", panel=HEALTH, nvrx_defaults=(("0.6", 50.0),)),
    _nvrx("gpu_memory_tolerance_mb", float, 512.0,
          "GPU memory (MiB) still in use that counts as reclaimed on a GPU without NVML's per-process view "
          "('none' keeps the default).",
          twin="--ft-", field="gpu_memory_tolerance_mb", parse=optional_number("--ft-gpu-memory-tolerance-mb"),
          metavar="MIB", panel=HEALTH),
    _nvrx("gpu_memory_poll_interval", float, 2.0,
          "At most this many seconds between two looks at GPU memory while waiting for it; the first come "
          "sooner ('none' keeps the default).",
          twin="--ft-", field="gpu_memory_poll_interval",
          parse=optional_number("--ft-gpu-memory-poll-interval", positive=True), metavar="SECONDS", panel=HEALTH),
    _nvrx("check_remaining_processes", bool, False,
          "After stopping the workers, look for processes of theirs that outlived them and name them. Read as "
          "ft_launcher reads it: false only for false/0/no (and off).",
          twin="--ft-", field="check_remaining_processes", parse=ft_bool("--ft-check-remaining-processes", "falsy"),
          valued=True, metavar="BOOL", panel=HEALTH),
    _nvrx("numa_bind_strict", bool, True,
          "With NVRX_GPUS_PER_NUMA set, workers are bound to their GPU's NUMA node: CPUs and memory (true), or "
          "CPUs with local allocation (false). Read as ft_launcher reads it: false only for false/0/no (and off).",
          twin="--ft-", field="numa_bind_strict", parse=ft_bool("--ft-numa-bind-strict", "falsy"), valued=True,
          metavar="BOOL", panel=HEALTH),
    # -- progress across restarts, and the exit code that says "do not requeue" --
    _nvrx("max_no_progress_cycles", int, 0,
          "Stop the job with --ft-no-restart-exit-code after this many rounds in a row (the first included) that "
          "did not advance --ft-checkpoint-iteration-file by --ft-min-progress-iterations (0 or less: off). "
          "Default 0, or the workers' NVRx's: 2 (0.6), 3 (0.7).",
          twin="--ft-", field="max_no_progress_cycles", parse=integer("--ft-max-no-progress-cycles"), metavar="N",
          panel=POLICY, nvrx_defaults=(("0.6", 2), ("0.7", 3))),
    _nvrx("min_progress_iterations", int, 1,
          "Iterations a round must add to the checkpoint to count as progress.",
          twin="--ft-", field="min_progress_iterations", parse=integer("--ft-min-progress-iterations"), metavar="N",
          panel=POLICY),
    _nvrx("checkpoint_iteration_file", str, None,
          "File holding the iteration of the latest checkpoint (one integer, e.g. Megatron's "
          "latest_checkpointed_iteration.txt), read after each round to measure progress.",
          twin="--ft-", field="checkpoint_iteration_file", metavar="FILE", panel=POLICY),
    _nvrx("no_restart_exit_code", int, 93,
          "The exit code of every launcher when the job must not be restarted or requeued (no progress, or "
          "--ft-attribution-stop-action no-restart), so a scheduler script can tell it from a failure.",
          parse=integer("--ft-no-restart-exit-code"), metavar="CODE", panel=POLICY),
    _nvrx("attribution_stop_action", str, STOP_LOG,
          "What a failure that restarting cannot fix does (ft_launcher: an attribution STOP verdict; here: the "
          "policy's, a --no-restart-exit-codes exit or a worker's ShutdownWorkload request): log records it in "
          "events.jsonl and the job ends with its usual exit code; no-restart ends every launcher with "
          "--ft-no-restart-exit-code, so a requeue script does not requeue it.",
          field="attribution_stop_action",
          parse=folded_choice("--ft-attribution-stop-action", (STOP_LOG, STOP_NO_RESTART), str.lower, none_ok=True),
          panel=POLICY),
    # -- per-round records --
    _nvrx("per_cycle_applog_prefix", str, None,
          "Also write every rank's output, prefixed, to <prefix>_cycle<N>.log per round (an absolute path, e.g. "
          "/lustre/logs/job.log); the run folder keeps per-round logs either way.",
          parse=absolute_path("--ft-per-cycle-applog-prefix"), metavar="PREFIX", panel=LOGGING,
          env=("PET_FT_PER_CYCLE_APPLOG_PREFIX",)),
    _nvrx("cycle_info_dir", str, None,
          "Directory where the rendezvous host writes a JSON file per round (cycle_info.<job>.<attempt>.<round>, "
          "and cycle_info.<job>.current); workers get its path in NVRX_CURRENT_CYCLE_INFO.",
          field="cycle_info_dir", metavar="DIR", panel=LOGGING),
    _nvrx("cycle_info_job_id", str, None,
          "The job id in cycle-info file names (nvrx-control's option); default: SLURM_ARRAY_JOB_ID, SLURM_JOB_ID, "
          "else the rendezvous id.", metavar="ID", panel=LOGGING),
    # -- accepted only: each help says what mbr-launch does instead --
    _nvrx("rdzv_impl", str, "barrier",
          "Accepted; mbr-launch has one rendezvous (c10d or static; spares with --nnodes MIN:MAX, --ft-segment).",
          twin="--ft-", parse=choice("--ft-rdzv-impl", ("barrier", "legacy")), panel=COMPAT),
    _nvrx("nvrx_logfile", str, None,
          "Accepted; the launcher's own lines go to the console and the run folder (events.jsonl, mbr-launch "
          "report).", metavar="FILE", panel=COMPAT, env=("PET_FT_NVRX_LOGFILE",)),
    _nvrx("enable_log_server", bool, False,
          "Accepted; no log server: each node writes its ranks' logs into its run folder (and "
          "--ft-per-cycle-applog-prefix).", parse=ft_bool("--ft-enable-log-server", "exact_true"), valued=True,
          metavar="BOOL", panel=COMPAT, env=("PET_FT_ENABLE_LOG_SERVER",)),
    _nvrx("log_server_port", int, 50051, "Accepted; no log server (see --ft-enable-log-server).",
          parse=integer("--ft-log-server-port"), metavar="PORT", panel=COMPAT, env=("PET_FT_LOG_SERVER_PORT",)),
    _nvrx("log_aggregator_count", int, 0, "Accepted; no log server (see --ft-enable-log-server).",
          parse=integer("--ft-log-aggregator-count"), metavar="N", panel=COMPAT, env=("PET_FT_LOG_AGGREGATOR_COUNT",)),
    _nvrx("log_leaf_max_queue_chunks", int, -1, "Accepted; no log server (see --ft-enable-log-server).",
          parse=integer("--ft-log-leaf-max-queue-chunks"), metavar="N", panel=COMPAT,
          env=("PET_FT_LOG_LEAF_MAX_QUEUE_CHUNKS",)),
    _nvrx("log_server_log_prefix", str, None, "Accepted; no log server (see --ft-enable-log-server).",
          metavar="PREFIX", panel=COMPAT, env=("PET_FT_LOG_SERVER_LOG_PREFIX",)),
    _nvrx("log_server_graceful_shutdown_timeout", float, 60.0,
          "Accepted; no log server (see --ft-enable-log-server).",
          parse=non_negative("--ft-log-server-graceful-shutdown-timeout", float), metavar="SECONDS", panel=COMPAT,
          env=("PET_FT_LOG_SERVER_GRACEFUL_SHUTDOWN_TIMEOUT",)),
    _nvrx("attribution_endpoint", str, None,
          "Accepted and handed to NVRx 0.6+ clients' config; no attribution service: mbr-launch's hang verdict "
          "names the rank that hung and why (the console, events.jsonl, mbr-launch report).",
          field="attribution_endpoint", metavar="URL", panel=COMPAT),
    _nvrx("attribution_export_url", str, None,
          "Accepted and handed to NVRx 0.7 clients' config; verdicts are in events.jsonl (see "
          "--ft-attribution-endpoint).", field="attribution_export_url", metavar="URL", panel=COMPAT),
    _nvrx("attribution_startup_timeout", float, 20.0, "Accepted; no attribution service (see "
          "--ft-attribution-endpoint).", parse=non_negative("--ft-attribution-startup-timeout", float),
          metavar="SECONDS", panel=COMPAT),
    _nvrx("attribution_compute_timeout", float, None, "Accepted (NVRx 0.6 only); no attribution service (see "
          "--ft-attribution-endpoint).", parse=non_negative("--ft-attribution-compute-timeout", float),
          metavar="SECONDS", panel=COMPAT),
    _nvrx("attribution_llm_api_key_file", str, None, "Accepted; no LLM is asked: the hang verdict rests on "
          "evidence (stacks, collectives, process state).", metavar="FILE", panel=COMPAT),
    _nvrx("attribution_llm_base_url", str, None, "Accepted; no LLM is asked (see --ft-attribution-llm-api-key-file).",
          metavar="URL", panel=COMPAT),
    _nvrx("attribution_llm_model", str, None, "Accepted; no LLM is asked (see --ft-attribution-llm-api-key-file).",
          metavar="MODEL", panel=COMPAT),
    _nvrx("attribution_analysis_backend", str, None, "Accepted (lib; mcp in NVRx 0.6); no attribution service (see "
          "--ft-attribution-endpoint).",
          parse=folded_choice("--ft-attribution-analysis-backend", ("lib", "mcp"), str.lower), panel=COMPAT),
    _nvrx("attribution_log_level", str, None, "Accepted; no attribution service (see --ft-attribution-endpoint).",
          parse=folded_choice("--ft-attribution-log-level", ("DEBUG", "INFO", "WARNING"), str.upper),
          panel=COMPAT),
)

__all__ = ["NVRX_SETTINGS", "STOP_LOG", "STOP_NO_RESTART"]
