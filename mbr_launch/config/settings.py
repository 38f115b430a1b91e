"""Every launcher setting, declared once.

The CLI options, the environment variables, the config-file keys, the man page, the shell completions
and the options page (docs/options.md) are all generated from ``SETTINGS``. Precedence when resolving a value:
command line > environment (``MBR_*`` first, then torchrun's ``PET_*``) > config file > default.

Resolution is pure: ``resolve(cli, environ, config_file)`` takes plain mappings, so tests need no
process state. Values are parsed and validated by each setting's ``parse`` function, which raises
``SettingError`` with a message that names the flag and the bad value. ``for_workers_nvrx`` then reads them as
the workers' NVRx version does where ft_launcher's versions disagree (defaults, a boolean's words). torchrun's
options are declared in ``torchrunsettings``, ft_launcher 0.6 and 0.7's own in ``nvrxsettings``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from mbr_launch.config import rawvalue
# The declaration's vocabulary, re-exported: callers import it from here with the table.
from mbr_launch.config.declare import (CHECKS, COMPAT, FAULT, HEALTH, LOGGING, PANELS, POLICY, SLURM, TORCHRUN,
                                       Setting, default_text, in_panel_order)
from mbr_launch.config.declare import ft_setting as _ft  # short: the table reads
from mbr_launch.config.errors import SettingError
from mbr_launch.config.ftparse import log_level, optional_number, versioned_bool
from mbr_launch.config.nvrxsettings import NVRX_SETTINGS
from mbr_launch.config.parse import (as_bool, choice, comma_list, exit_code_list, fraction, module_list,
                                     non_negative, optional_timeout, positive, section_timeouts, signal_list,
                                     signal_name)
from mbr_launch.config.torchrunsettings import TORCHRUN_SETTINGS
from mbr_launch.decide.policy import RESTART_POLICIES, SCOPES, Scope, When

SETTINGS: tuple[Setting, ...] = (
    # -- torchrun: every option of torch.distributed.run.get_args_parser(), same names and defaults --
    *TORCHRUN_SETTINGS,
    # -- fault tolerance: ft_launcher's flags as they are, plus readable names --
    Setting(name="config", flags=("--config", "--ft-cfg-path", "--ft-cfg_path", "--fault-tol-cfg-path"),
            kind=str, default=None, panel=FAULT, common=True, env=("PET_FT_CFG_PATH",), metavar="FILE",
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
    Setting(name="rank_monitor", flags=("--rank-monitor",), kind=str, default="on", panel=FAULT,
            parse=choice("--rank-monitor", ("on", "off")), choices=("on", "off"),
            help="Serve NVRx RankMonitorClient connections (FT_RANK_MONITOR_IPC_SOCKET) and enforce "
                 "their heartbeat and section timeouts."),
    Setting(name="stack_dump", flags=("--stack-dump",), kind=str, default="auto", panel=FAULT,
            parse=choice("--stack-dump", ("auto", "py-spy", "faulthandler", "off")),
            choices=("auto", "py-spy", "faulthandler", "off"),
            help="How stacks of hung ranks are captured before they are killed: py-spy (needs ptrace), "
                 "faulthandler (needs nothing), auto (py-spy, falling back to faulthandler)."),
    Setting(name="hang_kill_grace", flags=("--hang-kill-grace",), kind=float, default=3.0, panel=FAULT,
            parse=non_negative("--hang-kill-grace", float), metavar="SECONDS",
            help="Seconds a hung worker gets between SIGTERM and SIGKILL (crashes use --shutdown-timeout)."),
    Setting(name="hang_inquiry_timeout", flags=("--hang-inquiry-timeout",), kind=float, default=2.0, panel=FAULT,
            parse=positive("--hang-inquiry-timeout", float), metavar="SECONDS",
            help="When a deadline passes, every node gathers its ranks' evidence (collective progress, stacks, "
                 "process state) for at most this long before the verdict names the rank that hung."),
    Setting(name="standby", flags=("--standby",), kind=str, default="torch", panel=FAULT,
            parse=choice("--standby", ("off", "interpreter", "torch", "cuda")),
            choices=("off", "interpreter", "torch", "cuda"),
            help="Warm standby workers: one process per local rank that starts ahead of time and becomes the "
                 "rank at the next (re)start. interpreter: Python only (exactly a fresh process); torch: also "
                 "`import torch`, no CUDA, forked in milliseconds from a copy of the launcher that imported it "
                 "where the worker's environment allows (env vars a script sets before its own `import torch` "
                 "come too late, except OMP_NUM_THREADS, which is re-applied; others are warned about); cuda: "
                 "also a CUDA context on device LOCAL_RANK; off: fresh processes only."),
    Setting(name="standby_preload", flags=("--standby-preload",), kind=str, default=None, panel=FAULT,
            parse=module_list("--standby-preload"), metavar="MODULES",
            help="Modules each standby also imports ahead of time (comma-separated; none: nothing beyond the "
                 "--standby level), e.g. megatron.core. Default: torch._dynamo at --standby torch and cuda, "
                 "which DistributedDataParallel and torch.compile import on first use (about 1.5 s of each "
                 "restart), imported only where it delays no rank (replacement standbys; the first round's "
                 "with 4+ cores per local rank). Variables these modules read at import (TORCHDYNAMO_*, "
                 "TORCHINDUCTOR_*...) come from the launch environment: a rank whose script sets one later is "
                 "warned on its stderr; set it before launching, or use none."),
    # -- restart policy --
    Setting(name="restart_scope", flags=("--restart-scope",), kind=str, default=Scope.JOB.value, panel=POLICY,
            common=True, parse=choice("--restart-scope", SCOPES), choices=SCOPES,
            help="What restarts after a crash or hang: job (every rank, new rendezvous round: torchrun's "
                 "way), node (this node's ranks only), rank (the failed rank only; for workloads that "
                 "recover in process)."),
    Setting(name="restart_policy", flags=("--restart-policy", "--restart_policy", "--ft-restart-policy",
            "--ft-restart_policy"), kind=str, default=When.ANY_FAILED.value, panel=POLICY, ft_key="restart_policy",
            parse=choice("--restart-policy", RESTART_POLICIES), choices=RESTART_POLICIES,
            help="any-failed: any crash or hang restarts; min-healthy: a crashed rank is left lost (NVRx in-process "
                 "restart goes on without it) until fewer than MIN nodes have all ranks alive, then the job restarts."),
    Setting(name="max_startup_restarts", flags=("--max-startup-restarts",), kind=int, default=None,
            panel=POLICY, parse=non_negative("--max-startup-restarts", int), metavar="N",
            help="A separate budget for failures before any local rank showed progress (a heartbeat, an "
                 "optimizer step, a checkpoint, 20 collectives, an advancing iteration), counted apart from "
                 "later ones; default: they share --max-restarts."),
    Setting(name="max_node_failures", flags=("--max-node-failures",), kind=int, default=0, panel=POLICY,
            parse=non_negative("--max-node-failures", int), metavar="K",
            help="Exclude a node whose ranks failed K times (0: never); with --nnodes MIN:MAX a spare "
                 "agent takes its place and the job goes on while MIN nodes remain; a node that no waiting "
                 "spare could replace stays, and the job restarts while the budget lasts."),
    Setting(name="restart_backoff", flags=("--restart-backoff",), kind=float, default=1.0, panel=POLICY,
            parse=non_negative("--restart-backoff", float), metavar="SECONDS",
            help="First delay of a crash loop (rounds failing within --crash-loop-window); doubles each "
                 "time up to --restart-backoff-max. An isolated failure restarts at once."),
    Setting(name="restart_backoff_max", flags=("--restart-backoff-max",), kind=float, default=30.0,
            panel=POLICY, parse=non_negative("--restart-backoff-max", float), metavar="SECONDS",
            help="Longest crash-loop delay."),
    Setting(name="crash_loop_window", flags=("--crash-loop-window",), kind=float, default=30.0, panel=POLICY,
            parse=non_negative("--crash-loop-window", float), metavar="SECONDS",
            help="A round that fails sooner than this after it started, before any sign of progress (a "
                 "heartbeat, an optimizer step, a checkpoint, 20 collectives, an advancing iteration), is part "
                 "of a crash loop."),
    Setting(name="peer_timeout", flags=("--peer-timeout",), kind=float, default=15.0, panel=POLICY,
            parse=positive("--peer-timeout", float), metavar="SECONDS",
            help="Seconds of silence after which another node's agent (or the rendezvous store) counts as "
                 "lost (dead or cut off); the survivors stop their workers and go on per the policy instead "
                 "of waiting for NCCL. A dead worker is noticed at once regardless; this bounds silent "
                 "network cuts. Below about 10 s, a heavily loaded store host can be taken for lost."),
    Setting(name="rdzv_secret_file", flags=("--rdzv-secret-file",), kind=str, default=None, panel=POLICY,
            metavar="FILE", help="A file (mode 600, 16+ bytes) with a secret all agents share: every value they "
            "read from the c10d store, torch's pickled state included, must carry its HMAC, so a process that can "
            "reach the port without it can neither run code in the agents nor steer the job (docs/security.md)."),
    Setting(name="no_restart_exit_codes", flags=("--no-restart-exit-codes",), kind=str, default=(2, 17),
            panel=POLICY, parse=exit_code_list("--no-restart-exit-codes"), metavar="CODES",
            help="Worker exit codes that end the job instead of restarting it (2: bad configuration, "
                 "17: Megatron failed validation; 16, resume to disambiguate, restarts)."),
    # -- Slurm and preemption --
    Setting(name="slurm", flags=("--slurm",), kind=str, default="auto", panel=SLURM,
            parse=choice("--slurm", ("auto", "on", "off")), choices=("auto", "on", "off"),
            help="Derive --nnodes, --rdzv-endpoint, --rdzv-id and the c10d backend from the Slurm step "
                 "(auto: when SLURM_JOB_ID is set). Flags you give explicitly always win."),
    Setting(name="slurm_rdzv_port", flags=("--slurm-rdzv-port",), kind=int, default=None, panel=SLURM,
            parse=non_negative("--slurm-rdzv-port", int, most=65535), metavar="PORT",
            help="Port of the rendezvous store on the step's first node (default: derived from the job and "
                 "step ids, so two jobs sharing a node do not collide)."),
    Setting(name="preempt_signals", flags=("--preempt-signals",), kind=str, default="SIGTERM,SIGUSR1",
            panel=SLURM, parse=signal_list("--preempt-signals"), metavar="SIGNALS",
            help="Signals that mean preemption (scancel, srun --signal=USR1@60): the workers get "
                 "--preempt-forward-signal to checkpoint, --preempt-grace seconds, then SIGKILL; exit code 5."),
    Setting(name="preempt_forward_signal", flags=("--preempt-forward-signal",), kind=str, default="SIGTERM",
            panel=SLURM, parse=signal_name("--preempt-forward-signal"), metavar="SIGNAL",
            help="Signal sent to the workers on preemption (Megatron-Bridge saves a checkpoint on SIGTERM). "
                 "Workers ignore the other preemption signals, which Slurm also delivers to them directly."),
    Setting(name="preempt_grace", flags=("--preempt-grace",), kind=float, default=None, panel=SLURM,
            parse=non_negative("--preempt-grace", float), metavar="SECONDS",
            help="Seconds the workers get to checkpoint after a preemption signal (default: "
                 "--shutdown-timeout)."),
    Setting(name="requeue_on_preemption", flags=("--requeue-on-preemption",), kind=bool, default=False,
            panel=SLURM, help="After a preemption, node 0 runs `scontrol requeue $SLURM_JOB_ID` so the job "
                              "comes back and resumes from its checkpoint."),
    Setting(name="max_requeues", flags=("--max-requeues",), kind=int, default=None, panel=SLURM,
            parse=non_negative("--max-requeues", int), metavar="N",
            help="Requeue at most N times in the life of the job (compared with SLURM_RESTART_COUNT)."),
    # -- preflight checks (mbr-launch doctor) --
    Setting(name="skip_check", flags=("--skip-check",), kind=str, default="", panel=CHECKS, common=True,
            parse=comma_list, metavar="IDS",
            help="Doctor check ids to skip before launching (comma-separated; 'all' skips the preflight). "
                 "Errors stop the launch; `mbr-launch doctor` lists the ids."),
    Setting(name="pg_timeout", flags=("--pg-timeout",), kind=float, default=None, panel=CHECKS,
            parse=non_negative("--pg-timeout", float), metavar="SECONDS",
            help="The process-group (NCCL watchdog) timeout your script passes to init_process_group, so "
                 "the checks can compare it with the in-process-restart hard_timeout."),
    # -- logging --
    Setting(name="quiet", flags=("--quiet", "-q"), kind=bool, default=False, panel=LOGGING, common=True,
            help="Print only worker output and errors, not the launcher's progress lines."),
    Setting(name="keep_runs", flags=("--keep-runs",), kind=int, default=20, panel=LOGGING,
            parse=non_negative("--keep-runs", int), metavar="N",
            help="Run folders to keep in the default log folder (<temp dir>/mbr-launch-<uid>, where 'latest' "
                 "links to the newest): older ones no launcher uses are removed when a run starts (0 keeps "
                 "all). Folders under --log-dir are never removed."),
    # -- zero-code resiliency: automatic step heartbeats, stragglers, live status --
    Setting(name="autobeat", flags=("--autobeat",), kind=str, default="on", panel=FAULT,
            parse=choice("--autobeat", ("on", "off")), choices=("on", "off"),
            help="Heartbeat after every optimizer step of an unmodified script (a torch optimizer hook the "
                 "launcher installs in each worker; needs --rank-monitor on). Feeds --step-timeout, "
                 "straggler scores and goodput."),
    Setting(name="initial_step_timeout", flags=("--initial-step-timeout",), kind=float, default=3600.0,
            panel=FAULT, parse=optional_timeout("--initial-step-timeout"), metavar="SECONDS",
            help="Seconds from a rank's start to its first optimizer step, which includes start-up, "
                 "compilation and data warm-up ('none' disables)."),
    Setting(name="step_timeout", flags=("--step-timeout",), kind=float, default=1800.0, panel=FAULT, common=True,
            parse=optional_timeout("--step-timeout"), metavar="SECONDS",
            help="Seconds allowed between two optimizer steps of a rank, evaluation and checkpointing "
                 "included ('none' disables). Not applied to ranks whose script uses the NVRx "
                 "RankMonitorClient: its own heartbeat timeouts apply."),
    Setting(name="straggler_threshold", flags=("--straggler-threshold",), kind=float, default=0.7,
            panel=FAULT, parse=fraction("--straggler-threshold"), metavar="SCORE",
            help="Report a rank as a straggler when its relative score (fastest median step / its median) "
                 "or individual score (its best / its current) is below this."),
    Setting(name="straggler_interval", flags=("--straggler-interval",), kind=float, default=300.0,
            panel=FAULT, parse=non_negative("--straggler-interval", float), metavar="SECONDS",
            help="Seconds between straggler reports (0 disables them)."),
    Setting(name="stop_on_straggler", flags=("--stop-on-straggler",), kind=bool, default=False, panel=FAULT,
            help="Stop the job (exit code 1) when a straggler is reported."),
    Setting(name="status", flags=("--status",), kind=str, default="auto", panel=LOGGING, common=True,
            parse=choice("--status", ("auto", "live", "plain", "off")), choices=("auto", "live", "plain", "off"),
            help="Per-rank status (state, heartbeat age, section, step time, restarts): live (a table, on a "
                 "terminal), plain (a line every --status-interval), auto (live on a terminal, else plain)."),
    Setting(name="status_interval", flags=("--status-interval",), kind=float, default=30.0, panel=LOGGING,
            parse=non_negative("--status-interval", float), metavar="SECONDS",
            help="Seconds between plain status lines (0 disables them)."),
    # -- ft_launcher 0.6 and 0.7's options --
    *NVRX_SETTINGS,
)

BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}
BY_FT_KEY: dict[str, Setting] = {s.ft_key: s for s in SETTINGS if s.ft_key}


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
        """Whether the user gave this setting (command line, environment or config file)."""
        return self.sources.get(name, "default") != "default"


def parse_value(setting: Setting, raw: Any) -> Any:
    if raw is None:
        return rawvalue.null_value(setting, default_text(setting))
    rawvalue.check_text(setting, raw)
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
    """Pick each setting's value by precedence and parse it."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    given: dict[str, Any] = {}
    for setting in SETTINGS:
        raw, source = setting.default, "default"
        if cli.get(setting.name) is not None:
            raw, source = cli[setting.name], "cli"
        elif (env_name := rawvalue.env_name(setting, default_text(setting), environ)):
            raw, source = rawvalue.pet_switch(setting, env_name, environ[env_name]), f"env:{env_name}"
        elif setting.name in config_file:
            raw, source = config_file[setting.name], "config"
        try:
            values[setting.name] = raw if source == "default" and not isinstance(raw, str) \
                else parse_value(setting, raw)
        except SettingError as err:
            raise SettingError(f"{err}{rawvalue.source_hint(source)}") from None
        sources[setting.name] = source
        if source != "default":
            given[setting.name] = raw
    return Resolved(values=values, sources=sources, raw=given)


def for_workers_nvrx(resolved: Resolved, generation: str | None) -> Resolved:
    """``resolved`` as the workers' NVRx line ``generation`` reads it (None: no NVRx): that line's defaults for
    the settings left at their default (``Setting.nvrx_defaults``), and its reading of a value whose meaning
    changed between lines (``ftparse.versioned_bool``)."""
    values = dict(resolved.values)
    for setting in SETTINGS:
        if not resolved.given(setting.name):
            if setting.nvrx_defaults:
                default = setting.default_for(generation)
                values[setting.name] = parse_value(setting, default) if isinstance(default, str) else default
        elif (reread := getattr(setting.parse, "for_generation", None)) and setting.name in resolved.raw:
            values[setting.name] = reread(generation)(resolved.raw[setting.name])
    return Resolved(values=values, sources=resolved.sources, raw=resolved.raw, nvrx=generation)
