"""torchrun's options as settings (part of ``settings.SETTINGS``): every option of
``torch.distributed.run.get_args_parser()`` in torch 2.13 to 2.15, with its names, default and ``PET_*`` variable
(``tests/test_flag_parity`` compares them with the installed torch's parser).
"""

from __future__ import annotations

from mbr_launch.config.declare import LOGGING, Setting
from mbr_launch.config.declare import torchrun_setting as _torchrun  # short: the table reads
from mbr_launch.config.parse import choice, comma_list, non_negative, signal_list

TORCHRUN_SETTINGS: tuple[Setting, ...] = (
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
              parse=choice("--start-method", ("spawn", "fork", "forkserver")),
              choices=("spawn", "fork", "forkserver")),
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
              parse=choice("--numa-binding", ("node", "socket", "exclusive", "core-complex")),
              choices=("node", "socket", "exclusive", "core-complex")),
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
)
