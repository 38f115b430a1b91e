"""Every launcher setting, declared once.

The CLI options, environment variables, config-file keys, man page, completions and docs/options.md are all
generated from ``SETTINGS``. Precedence: command line > environment (``MBR_*``, then torchrun's ``PET_*``) >
config file > default. ``resolve`` is pure (plain mappings in); ``for_workers_nvrx`` then reads the values as
the workers' NVRx does where ft_launcher's versions disagree.

The table in the order of the help: torchrun's options (``tests/test_flag_parity`` compares them with the
installed torch's parser), mbr-launch's own with ft_launcher 0.4.1's, then ft_launcher 0.6 and 0.7's. Those of
ft_launcher's without a meaning here are in the ``COMPAT`` panel, and their help says what happens instead."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

# The declaration's vocabulary, re-exported: callers import it from here with the table.
from mbr_launch.config.declare import (CHECKS, COMPAT, FAULT, HEALTH, LOGGING, PANELS, POLICY, SLURM, TORCHRUN,
                                       Setting, default_text, in_panel_order)
# short: the table reads
from mbr_launch.config.declare import (ft_setting as _ft, nvrx_setting as _nvrx, own_setting as _own,
                                       torchrun_setting as _torchrun)
from mbr_launch.config.errors import SettingError
from mbr_launch.config.nvrx import (absolute_path, absolute_paths, folded_choice, ft_bool, integer, log_level,
                                    optional_number, versioned_bool)
from mbr_launch.config.parse import (as_bool, choice, comma_list, exit_code_list, fraction, module_list,
                                     non_negative, optional_timeout, positive, section_timeouts, signal_list,
                                     signal_name)
from mbr_launch.decide.policy import RESTART_POLICIES, SCOPES, Scope, When

# What an attribution STOP recommendation does (``--ft-attribution-stop-action``), as mbr-launch's verdict does it.
STOP_LOG, STOP_NO_RESTART = "log", "no-restart"

SETTINGS: tuple[Setting, ...] = (
    # -- torchrun: every option of torch.distributed.run.get_args_parser(), same names and defaults --
    _torchrun("nnodes", str, "1:1", "Number of nodes, or the range of nodes in form MIN:MAX.",
              metavar="N|MIN:MAX", common=True),
    _torchrun("nproc_per_node", str, "1", "Number of workers per node: an integer, auto, cpu, gpu or xpu.",
              metavar="{N,auto,cpu,gpu,xpu}", common=True, values=("gpu", "cpu", "auto", "xpu", "1", "2", "4", "8")),
    _torchrun("rdzv_backend", str, "static", "Rendezvous backend: c10d (or static; etcd is not supported).",
              metavar="{c10d,static}", common=True, values=("c10d", "static")),
    _torchrun("rdzv_endpoint", str, "", "Rendezvous endpoint, HOST[:PORT] (c10d default port 29400).",
              metavar="HOST:PORT", common=True),
    _torchrun("rdzv_id", str, "none", "User-defined id of the job; all agents of one job use the same.",
              metavar="ID", common=True),
    _torchrun("rdzv_conf", str, "", "Extra rendezvous configuration: KEY=VALUE,... (e.g. join_timeout=600).",
              metavar="K=V,..."),
    _torchrun("standalone", bool, False,
              "Single-node job: start a local c10d rendezvous on a free port; overrides the rdzv flags.", common=True),
    _torchrun("max_restarts", int, 0, "Restarts allowed after worker failures, counted for the whole job.",
              parse=non_negative("--max-restarts", int), metavar="N", common=True),
    _torchrun("monitor_interval", float, 0.1,
              "Seconds between membership checks (failures are detected by events, not by this poll).",
              parse=non_negative("--monitor-interval", float), metavar="SECONDS"),
    _torchrun("start_method", str, "spawn",
              "Accepted for torchrun compatibility; workers are always fresh processes (spawn semantics).",
              parse=choice("--start-method", ("spawn", "fork", "forkserver"))),
    _torchrun("event_log_handler", str, "null", "torchelastic event handler name (accepted for compatibility).",
              metavar="NAME"),
    _torchrun("role", str, "default", "User-defined role of the workers (ROLE_NAME).", metavar="NAME"),
    _torchrun("module", bool, False, "Run the training script as a module, like 'python -m'.", short="-m", common=True),
    _torchrun("no_python", bool, False, "Execute the training script directly instead of with python."),
    _torchrun("run_path", bool, False, "Run the script with runpy.run_path (torchrun compatibility)."),
    _torchrun("log_dir", str, None,
              "Directory for logs, stack dumps and the event log (a private per-run sub-directory is created; "
              "default: <temp dir>/mbr-launch-<uid>).",
              metavar="DIR", panel=LOGGING, common=True),
    _torchrun("redirects", str, "0",
              "Redirect std streams of workers into log files: 0 none, 1 stdout, 2 stderr, 3 both, or per "
              "local rank '0:1,1:2'.", short="-r", metavar="SPEC", panel=LOGGING, values=("0", "1", "2", "3")),
    _torchrun("tee", str, "0", "Tee std streams into log files and the console (same format as --redirects).",
              short="-t", metavar="SPEC", panel=LOGGING, values=("0", "1", "2", "3")),
    _torchrun("log_line_prefix_template", str, "",
              "Prefix of each console line of a rank, a template of ${rank}, ${local_rank}, ${role_name} and "
              "${hostname} (e.g. '${hostname}:${rank}: '); also before the lines of --duplicate-*-filters "
              "(default: [rank${rank}]:).", metavar="TEMPLATE", panel=LOGGING,
              env=("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE",), since=(2, 14)),
    _torchrun("local_ranks_filter", str, "",
              "Only show the console output of these local ranks (e.g. 0,1); log files keep everything.",
              metavar="RANKS", panel=LOGGING),
    _torchrun("duplicate_stdout_filters", str, "",
              "Copy worker stdout lines matching any of these comma-separated strings to "
              "filtered_stdout.log (',,' escapes a comma).", parse=comma_list, metavar="FILTERS",
              panel=LOGGING),
    _torchrun("duplicate_stderr_filters", str, "",
              "Copy worker stderr lines matching any of these strings to filtered_stderr.log.",
              parse=comma_list, metavar="FILTERS", panel=LOGGING),
    _torchrun("node_rank", int, 0, "Rank of this node (static rendezvous only).",
              parse=non_negative("--node-rank", int), metavar="N"),
    _torchrun("master_addr", str, "127.0.0.1", "Address of the rank-0 node (static rendezvous only).",
              metavar="HOST"),
    _torchrun("master_port", int, None,
              "Port of the rank-0 node's store (static rendezvous only), the workers' MASTER_PORT as under torchrun.",
              parse=non_negative("--master-port", int, most=65535), metavar="PORT"),
    _torchrun("local_addr", str, None, "Address of this node (default: its FQDN).", metavar="HOST"),
    _torchrun("logs_specs", str, None, "torchrun.logs_specs entry point: 'default' (torchrun's own, what "
              "mbr-launch writes: per-rank stdout.log and stderr.log under --log-dir); another is refused.",
              pet=False, metavar="NAME", panel=LOGGING),
    _torchrun("numa_binding", str, None, "Bind workers to the CPUs of a NUMA node: node, socket, exclusive, "
              "core-complex.", pet=False,
              parse=choice("--numa-binding", ("node", "socket", "exclusive", "core-complex"))),
    _torchrun("signals_to_handle", str, "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
              "Signals the launcher catches and forwards to the workers before stopping them.",
              parse=signal_list("--signals-to-handle"), metavar="SIGNALS"),
    # ft_launcher's two stop timeouts (signal forwarded: --term-timeout; restart: --workers-stop-timeout)
    # are one grace here, the time a stopping worker gets in either case.
    _torchrun("shutdown_timeout", float, None,
              "Seconds a stopped worker gets between SIGTERM and SIGKILL (default "
              "$TORCH_ELASTIC_SHUTDOWN_TIMEOUT or 30), whether the launcher restarts it or forwards a signal "
              "(ft_launcher's --workers-stop-timeout and --term-timeout).",
              parse=non_negative("--shutdown-timeout", float), metavar="SECONDS",
              aliases=("--workers-stop-timeout", "--workers_stop_timeout", "--term-timeout", "--term_timeout")),
    _torchrun("virtual_local_rank", bool, False,
              "Set LOCAL_RANK=0 in every worker and point CUDA_VISIBLE_DEVICES at its own GPU."),
    # -- fault tolerance: ft_launcher's flags as they are, plus readable names --
    _own("config", str, None, aliases=("--ft-cfg-path", "--ft-cfg_path", "--fault-tol-cfg-path"), panel=FAULT,
         common=True, env=("PET_FT_CFG_PATH",), metavar="FILE",
         help="YAML config file: an 'mbr_launch:' section with any setting, and/or ft_launcher's "
              "'fault_tolerance:' section as it is."),
    _ft("initial_heartbeat_timeout", "initial_rank_heartbeat_timeout", float, 3600.0,
        "Seconds from a rank's start until its first heartbeat ('none', 'null' or '' disables). Default 3600, "
        "or none when the workers import NVRx 0.6+ (ft_launcher 0.6+'s default).",
        native="--initial-heartbeat-timeout", parse=optional_timeout("--ft-initial-rank-heartbeat-timeout"),
        metavar="SECONDS", nvrx_defaults=(("0.6", None),)),
    _ft("heartbeat_timeout", "rank_heartbeat_timeout", float, 2700.0,
        "Seconds allowed between two heartbeats of a rank ('none', 'null' or '' disables). Default 2700, or "
        "none when the workers import NVRx 0.6+ (ft_launcher 0.6+'s default).",
        native="--heartbeat-timeout", parse=optional_timeout("--ft-rank-heartbeat-timeout"),
        metavar="SECONDS", nvrx_defaults=(("0.6", None),)),
    _ft("section_timeouts", "rank_section_timeouts", str, {},
        "Per-section timeouts, e.g. setup:600,step:180,checkpointing:420.", native="--section-timeouts",
        parse=section_timeouts, metavar="NAME:SECONDS,..."),
    _ft("out_of_section_timeout", "rank_out_of_section_timeout", float, None,
        "Seconds a rank may spend outside any section ('none', 'null' or '' disables).",
        native="--out-of-section-timeout",
        parse=optional_timeout("--ft-rank-out-of-section-timeout"), metavar="SECONDS"),
    _ft("workload_check_interval", "workload_check_interval", float, 5.0,
        "Accepted ('none' keeps the default); mbr-launch's deadlines are timers, not polls: a hang is seen "
        "within 0.2 s of its timeout.", parse=optional_number("--ft-workload-check-interval"), metavar="SECONDS",
        panel=COMPAT),
    _ft("safety_factor", "safety_factor", float, 5.0,
        "Multiplier the NVRx client applies to observed intervals when it calculates timeouts.",
        parse=optional_number("--ft-safety-factor"), metavar="X"),
    _ft("rank_termination_signal", "rank_termination_signal", str, "SIGKILL",
        "Accepted; a hung rank's stacks are dumped, then its group gets SIGTERM and SIGKILL after "
        "--hang-kill-grace.", parse=signal_name("--ft-rank-termination-signal"), metavar="SIGNAL", panel=COMPAT),
    _ft("ft_log_level", "log_level", str, "INFO", "Log level handed to NVRx clients (any case; DBG and WARN too).",
        parse=log_level("--ft-log-level"), metavar="LEVEL"),
    _ft("node_health_check_interval", "node_health_check_interval", float, 5.0,
        "Accepted ('none' keeps the default); mbr-launch checks a node's health before it joins (Node health "
        "options) and learns of a lost node within --peer-timeout.",
        parse=optional_number("--ft-node-health-check-interval"), metavar="SECONDS", panel=COMPAT),
    _ft("restart_check_interval", "restart_check_interval", float, 60.0,
        "Accepted ('none' keeps the default); restarts are events here, not polls.",
        parse=optional_number("--ft-restart-check-interval"), metavar="SECONDS", panel=COMPAT),
    _ft("enable_nic_monitor", "enable_nic_monitor", bool, False,
        "Accepted and handed to the NVRx clients' config; mbr-launch runs no NIC monitor (--ft-enable-nic-healthcheck "
        "checks links before a node joins). A word other than true/false/1/0/yes/no/on/off is read as the "
        "workers' NVRx reads it: false by 0.4.1, true by 0.6+.",
        parse=versioned_bool("--ft-enable-nic-monitor", {"0.4": "truthy", "0.6": "falsy"}), deprecated_dashed=True,
        valued=True, metavar="BOOL", panel=COMPAT),
    _ft("pci_topo_file", "pci_topo_file", str, None, "Accepted and handed to the NVRx clients' config (it serves "
        "ft_launcher's NIC monitor, which mbr-launch does not run).", metavar="FILE", deprecated_dashed=True,
        panel=COMPAT),
    _ft("link_down_path_template", "link_down_path_template", str, None,
        "Accepted and handed to the NVRx clients' config (it serves ft_launcher's NIC monitor, which mbr-launch "
        "does not run).", metavar="TEMPLATE", deprecated_dashed=True, panel=COMPAT),
    Setting(name="ignore_missing_ft_config", flags=("--ignore-missing-fault-tol-cfg", "--ft-ignore-missing-cfg"),
            kind=bool, default=False, panel=COMPAT,
            help="Accepted (0.4.1's and 0.7's spellings): without a fault_tolerance config the defaults apply, "
                 "with or without this flag."),
    _own("rank_monitor", str, "on", panel=FAULT, parse=choice("--rank-monitor", ("on", "off")),
         help="Serve NVRx RankMonitorClient connections (FT_RANK_MONITOR_IPC_SOCKET) and enforce "
              "their heartbeat and section timeouts."),
    _own("stack_dump", str, "auto", panel=FAULT,
         parse=choice("--stack-dump", ("auto", "py-spy", "faulthandler", "off")),
         help="How stacks of hung ranks are captured before they are killed: py-spy (needs ptrace), "
              "faulthandler (needs nothing), auto (py-spy, falling back to faulthandler)."),
    _own("hang_kill_grace", float, 3.0, panel=FAULT, parse=non_negative("--hang-kill-grace", float), metavar="SECONDS",
         help="Seconds a hung worker gets between SIGTERM and SIGKILL (crashes use --shutdown-timeout)."),
    _own("hang_inquiry_timeout", float, 2.0, panel=FAULT, parse=positive("--hang-inquiry-timeout", float),
         metavar="SECONDS",
         help="When a deadline passes, every node gathers its ranks' evidence (collective progress, stacks, "
              "process state) for at most this long before the verdict names the rank that hung."),
    _own("standby", str, "torch", panel=FAULT, parse=choice("--standby", ("off", "interpreter", "torch", "cuda")),
         help="Warm standby workers: one process per local rank that starts ahead of time and becomes the "
              "rank at the next (re)start. interpreter: Python only (exactly a fresh process); torch: also "
              "`import torch`, no CUDA, forked in milliseconds from a copy of the launcher that imported it "
              "where the worker's environment allows (env vars a script sets before its own `import torch` "
              "come too late, except OMP_NUM_THREADS, which is re-applied; others are warned about); cuda: "
              "also a CUDA context on device LOCAL_RANK; off: fresh processes only."),
    _own("standby_preload", str, None, panel=FAULT, parse=module_list("--standby-preload"), metavar="MODULES",
         help="Modules each standby also imports ahead of time (comma-separated; none: nothing beyond the "
              "--standby level), e.g. megatron.core. Default: torch._dynamo at --standby torch and cuda, "
              "which an optimizer, DistributedDataParallel and torch.compile import on first use (about 2 s "
              "of CPU per rank and restart): imported once by the fork server, before it forks any worker; "
              "without a fork server, by the replacement standbys, and the first round's with 4+ cores per "
              "local rank. Variables these modules read at import (TORCHDYNAMO_*, "
              "TORCHINDUCTOR_*...) come from the launch environment: a rank whose script sets one later is "
              "warned on its stderr; set it before launching, or use none."),
    # -- restart policy --
    _own("restart_scope", str, Scope.JOB.value, panel=POLICY, common=True, parse=choice("--restart-scope", SCOPES),
         help="What restarts after a crash or hang: job (every rank, new rendezvous round: torchrun's "
              "way), node (this node's ranks only), rank (the failed rank only; for workloads that "
              "recover in process)."),
    _own("restart_policy", str, When.ANY_FAILED.value,
         aliases=("--restart_policy", "--ft-restart-policy", "--ft-restart_policy"), panel=POLICY,
         ft_key="restart_policy", parse=choice("--restart-policy", RESTART_POLICIES),
         help="any-failed: any crash or hang restarts; min-healthy: a crashed rank is left lost (NVRx in-process "
              "restart goes on without it) until fewer than MIN nodes have all ranks alive, then the job restarts."),
    _own("max_startup_restarts", int, None, panel=POLICY, parse=non_negative("--max-startup-restarts", int),
         metavar="N",
         help="A separate budget for failures before any local rank showed progress (a heartbeat, an "
              "optimizer step, a checkpoint, 20 collectives, an advancing iteration), counted apart from "
              "later ones; default: they share --max-restarts."),
    _own("max_node_failures", int, 0, panel=POLICY, parse=non_negative("--max-node-failures", int), metavar="K",
         help="Exclude a node whose ranks failed K times (0: never); with --nnodes MIN:MAX a spare "
              "agent takes its place and the job goes on while MIN nodes remain; a node that no waiting "
              "spare could replace stays, and the job restarts while the budget lasts."),
    _own("restart_backoff", float, 1.0, panel=POLICY, parse=non_negative("--restart-backoff", float), metavar="SECONDS",
         help="First delay of a crash loop (rounds failing within --crash-loop-window); doubles each "
              "time up to --restart-backoff-max. An isolated failure restarts at once."),
    _own("restart_backoff_max", float, 30.0, panel=POLICY, parse=non_negative("--restart-backoff-max", float),
         metavar="SECONDS", help="Longest crash-loop delay."),
    _own("crash_loop_window", float, 30.0, panel=POLICY, parse=non_negative("--crash-loop-window", float),
         metavar="SECONDS",
         help="A round that fails sooner than this after it started, before any sign of progress (a "
              "heartbeat, an optimizer step, a checkpoint, 20 collectives, an advancing iteration), is part "
              "of a crash loop."),
    _own("peer_timeout", float, 15.0, panel=POLICY, parse=positive("--peer-timeout", float), metavar="SECONDS",
         help="Seconds of silence after which another node's agent (or the rendezvous store) counts as "
              "lost (dead or cut off); the survivors stop their workers and go on per the policy instead "
              "of waiting for NCCL. A dead worker is noticed at once regardless; this bounds silent "
              "network cuts. Below about 10 s, a heavily loaded store host can be taken for lost."),
    _own("rdzv_secret_file", str, None, panel=POLICY, metavar="FILE",
         help="A file (mode 600, 16+ bytes) with a secret all agents share: every value they "
              "read from the c10d store, torch's pickled state included, must carry its HMAC, so a process that can "
              "reach the port without it can neither run code in the agents nor steer the job (docs/security.md)."),
    _own("no_restart_exit_codes", str, (2, 17), panel=POLICY, parse=exit_code_list("--no-restart-exit-codes"),
         metavar="CODES",
         help="Worker exit codes that end the job instead of restarting it (2: bad configuration, "
              "17: Megatron failed validation; 16, resume to disambiguate, restarts)."),
    # -- Slurm and preemption --
    _own("slurm", str, "auto", panel=SLURM, parse=choice("--slurm", ("auto", "on", "off")),
         help="Derive --nnodes, --rdzv-endpoint, --rdzv-id and the c10d backend from the Slurm step "
              "(auto: when SLURM_JOB_ID is set). Flags you give explicitly always win."),
    _own("slurm_rdzv_port", int, None, panel=SLURM, parse=non_negative("--slurm-rdzv-port", int, most=65535),
         metavar="PORT",
         help="Port of the rendezvous store on the step's first node (default: derived from the job and "
              "step ids, so two jobs sharing a node do not collide)."),
    _own("preempt_signals", str, "SIGTERM,SIGUSR1", panel=SLURM, parse=signal_list("--preempt-signals"),
         metavar="SIGNALS",
         help="Signals that mean preemption (scancel, srun --signal=USR1@60): the workers get "
              "--preempt-forward-signal to checkpoint, --preempt-grace seconds, then SIGKILL; exit code 5."),
    _own("preempt_forward_signal", str, "SIGTERM", panel=SLURM, parse=signal_name("--preempt-forward-signal"),
         metavar="SIGNAL",
         help="Signal sent to the workers on preemption (Megatron-Bridge saves a checkpoint on SIGTERM). "
              "Workers ignore the other preemption signals, which Slurm also delivers to them directly."),
    _own("preempt_grace", float, None, panel=SLURM, parse=non_negative("--preempt-grace", float), metavar="SECONDS",
         help="Seconds the workers get to checkpoint after a preemption signal (default: "
              "--shutdown-timeout)."),
    _own("requeue_on_preemption", bool, False, panel=SLURM,
         help="After a preemption, node 0 runs `scontrol requeue $SLURM_JOB_ID` so the job "
              "comes back and resumes from its checkpoint."),
    _own("max_requeues", int, None, panel=SLURM, parse=non_negative("--max-requeues", int), metavar="N",
         help="Requeue at most N times in the life of the job (compared with SLURM_RESTART_COUNT)."),
    # -- preflight checks (mbr-launch doctor) --
    _own("skip_check", str, "", panel=CHECKS, common=True, parse=comma_list, metavar="IDS",
         help="Doctor check ids to skip before launching (comma-separated; 'all' skips the preflight). "
              "Errors stop the launch; `mbr-launch doctor` lists the ids."),
    _own("pg_timeout", float, None, panel=CHECKS, parse=non_negative("--pg-timeout", float), metavar="SECONDS",
         help="The process-group (NCCL watchdog) timeout your script passes to init_process_group, so "
              "the checks can compare it with the in-process-restart hard_timeout."),
    # -- logging --
    _own("quiet", bool, False, aliases=("-q",), panel=LOGGING, common=True,
         help="Print only worker output and errors, not the launcher's progress lines."),
    _own("keep_runs", int, 20, panel=LOGGING, parse=non_negative("--keep-runs", int), metavar="N",
         help="Run folders to keep in the default log folder (<temp dir>/mbr-launch-<uid>, where 'latest' "
              "links to the newest): older ones no launcher uses are removed when a run starts (0 keeps "
              "all). Folders under --log-dir are never removed."),
    # -- zero-code resiliency: automatic step heartbeats, stragglers, live status --
    _own("autobeat", str, "on", panel=FAULT, parse=choice("--autobeat", ("on", "off")),
         help="Heartbeat after every optimizer step of an unmodified script (a torch optimizer hook the "
              "launcher installs in each worker; needs --rank-monitor on). Feeds --step-timeout, "
              "straggler scores and goodput."),
    _own("initial_step_timeout", float, 3600.0, panel=FAULT, parse=optional_timeout("--initial-step-timeout"),
         metavar="SECONDS",
         help="Seconds from a rank's start to its first optimizer step, which includes start-up, "
              "compilation and data warm-up ('none' disables)."),
    _own("step_timeout", float, 1800.0, panel=FAULT, common=True, parse=optional_timeout("--step-timeout"),
         metavar="SECONDS",
         help="Seconds allowed between two optimizer steps of a rank, evaluation and checkpointing "
              "included ('none' disables). Not applied to ranks whose script uses the NVRx "
              "RankMonitorClient: its own heartbeat timeouts apply."),
    _own("straggler_threshold", float, 0.7, panel=FAULT, parse=fraction("--straggler-threshold"), metavar="SCORE",
         help="Report a rank as a straggler when its relative score (fastest median step / its median) "
              "or individual score (its best / its current) is below this."),
    _own("straggler_interval", float, 300.0, panel=FAULT, parse=non_negative("--straggler-interval", float),
         metavar="SECONDS", help="Seconds between straggler reports (0 disables them)."),
    _own("stop_on_straggler", bool, False, panel=FAULT,
         help="Stop the job (exit code 1) when a straggler is reported."),
    _own("status", str, "auto", panel=LOGGING, common=True, parse=choice("--status", ("auto", "live", "plain", "off")),
         help="Per-rank status (state, heartbeat age, section, step time, restarts): live (a table, on a "
              "terminal), plain (a line every --status-interval), auto (live on a terminal, else plain)."),
    _own("status_interval", float, 30.0, panel=LOGGING, parse=non_negative("--status-interval", float),
         metavar="SECONDS", help="Seconds between plain status lines (0 disables them)."),
    # -- ft_launcher 0.6 and 0.7's options --
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

BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}
BY_FT_KEY: dict[str, Setting] = {s.ft_key: s for s in SETTINGS if s.ft_key}
BY_FLAG: dict[str, Setting] = {flag: s for s in SETTINGS for flag in s.flags}


@dataclass(frozen=True)
class Resolved:
    values: dict[str, Any]
    sources: dict[str, str] = field(default_factory=dict)  # name -> "cli" | "env:NAME" | "config" | "default"
    raw: dict[str, Any] = field(default_factory=dict)  # name -> the value as given, for settings not at default
    # The workers' NVRx line the values follow (``for_workers_nvrx``); None: not applied yet, or no NVRx.
    nvrx: str | None = None

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    def given(self, name: str) -> bool:
        return self.sources.get(name, "default") != "default"


# ---- a raw value's checks before its parser sees it: where it came from can make it unusable (an empty
# environment variable, bytes that are not UTF-8 outside file names, a YAML null) ----

# Settings whose values are file names: those may hold any bytes the file system allows.
_PATH_SETTINGS = frozenset({"log_dir", "config", "pci_topo_file", "link_down_path_template", "link_state_path_template",
                            "storage_health_check_path", "segment_health_check_dir", "checkpoint_iteration_file",
                            "per_cycle_applog_prefix", "cycle_info_dir", "nvrx_logfile", "log_server_log_prefix",
                            "attribution_llm_api_key_file"})


def _env_name(setting: Setting, default: str, environ: Mapping[str, str]) -> str | None:
    for name in setting.envvars:
        value = environ.get(name)
        if value is None or (value == "" and default == ""):
            continue
        if value == "":
            raise SettingError(f"{name} is set but empty; unset it or give it a value for {setting.flag} "
                               f"(default: {default})")
        return name
    return None


def _pet_switch(setting: Setting, name: str, raw: str) -> str:
    """torchrun reads a switch's ``PET_`` variable as ``bool(int(value))`` (``PET_STANDALONE=2`` runs standalone);
    other words are left to the switch's own reading."""
    if not (name.startswith("PET_") and setting.kind is bool and not setting.valued):
        return raw
    try:
        return "true" if int(raw) else "false"
    except ValueError:
        return raw


def _check_text(setting: Setting, raw: Any) -> None:
    """An id, a host or a role must be text: torch's store refuses other bytes deep inside the rendezvous."""
    if isinstance(raw, str) and setting.name not in _PATH_SETTINGS:
        try:
            raw.encode("utf-8")
        except UnicodeEncodeError:
            raise SettingError(f"{setting.flag}: the value is not valid UTF-8 text (got {raw!r})") from None


def _null_value(setting: Setting, default: str) -> Any:
    if setting.default is None:
        return None
    if setting.parse is not None and getattr(setting.parse, "takes_none", False):
        return setting.parse(None)
    raise SettingError(f"{setting.flag}: needs a value, not null (leave the key out for the default, {default!r})")


def _source_hint(source: str) -> str:
    if source.startswith("env:"):
        return f" (from the environment variable {source[4:]})"
    return " (from the config file)" if source == "config" else ""


def parse_value(setting: Setting, raw: Any) -> Any:
    if raw is None:
        return _null_value(setting, default_text(setting))
    _check_text(setting, raw)
    if setting.kind is bool:
        try:
            return setting.parse(raw) if setting.parse else as_bool(raw)
        except SettingError as err:
            raise SettingError(err if setting.parse else f"{setting.flag}: {err}") from None
    if setting.parse:
        return setting.parse(raw)
    if setting.kind in (int, float):
        try:
            return setting.kind(raw)
        except (TypeError, ValueError):
            raise SettingError(f"{setting.flag}: expected a {setting.kind.__name__} (got {raw!r})") from None
    return str(raw)


def resolve(cli: Mapping[str, Any], environ: Mapping[str, str], config_file: Mapping[str, Any]) -> Resolved:
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    given: dict[str, Any] = {}
    for setting in SETTINGS:
        raw, source = setting.default, "default"
        if cli.get(setting.name) is not None:
            raw, source = cli[setting.name], "cli"
        elif (env_name := _env_name(setting, default_text(setting), environ)):
            raw, source = _pet_switch(setting, env_name, environ[env_name]), f"env:{env_name}"
        elif setting.name in config_file:
            raw, source = config_file[setting.name], "config"
        try:
            values[setting.name] = raw if source == "default" and not isinstance(raw, str) \
                else parse_value(setting, raw)
        except SettingError as err:
            raise SettingError(f"{err}{_source_hint(source)}") from None
        sources[setting.name] = source
        if source != "default":
            given[setting.name] = raw
    return Resolved(values=values, sources=sources, raw=given)


def for_workers_nvrx(resolved: Resolved, generation: str | None) -> Resolved:
    """``resolved`` as the workers' NVRx line ``generation`` reads it (None: no NVRx): that line's defaults for the
    settings left at their default, and its reading of a value whose meaning changed between lines."""
    values = dict(resolved.values)
    for setting in SETTINGS:
        if not resolved.given(setting.name):
            if setting.nvrx_defaults:
                default = setting.default_for(generation)
                values[setting.name] = parse_value(setting, default) if isinstance(default, str) else default
        elif (reread := getattr(setting.parse, "for_generation", None)) and setting.name in resolved.raw:
            values[setting.name] = reread(generation)(resolved.raw[setting.name])
    return Resolved(values=values, sources=resolved.sources, raw=resolved.raw, nvrx=generation)
