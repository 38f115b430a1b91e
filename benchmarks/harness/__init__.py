"""Shared pieces of the launcher benchmarks, one module per concern:

- ``launchers``: who is launched how (mbr-launch, torchrun, ft_launcher, yardsticks), which mbr_launch code
- ``processes``: launcher runs in their own session, pidfd exits, the token-based cleanup, ``Trial``
- ``timing``: the workers' ready lines and mbr-launch's events.jsonl (its own reader)
- ``failures``: one-line failure reasons from stderr, and the report's failure/leftover lines
- ``stats``: medians, quartiles, ratios and their formatting
- ``reports``: Markdown tables, RESULTS.md sections, raw records, trial directories
- ``machine``: the machine and versions a report was measured on
- ``skeleton``: the command line, the interleaved trial loop and --from-raw that every trial bench shares

The benches do ``import harness as h`` and use the names below.
"""

from . import paths  # noqa: F401  (first: puts the repository on sys.path for mbr_launch and testkit.helpers)
from testkit.helpers import free_port

from .failures import REASONS, classify, failure_lines, failure_reason, first_failed
from .launchers import (BASELINE, LAUNCHERS, TORCHRUN, LaunchSpec, Launcher, mbr_env, mbr_source, pick_launchers,
                        tool, variant_names, with_mbr_path, worker_argv)
from .machine import machine_lines
from .paths import COLLECTIVE, REPO, WORKERS
from .processes import (MARKER, ExitWatch, Proc, Trial, bench_env, end_agents, kill_marked, marked_pids, run_to_exit,
                        stop_on_sigterm)
from .reports import command_line, load_raw, publish, table, write_raw, write_section
from .skeleton import (Outcome, Session, Step, bench_parser, launchers_in, plan, render_raw, rotate, run_trials,
                       start)
from .stats import Summary, fmt_cell, fmt_iqr, fmt_s, paired_ratios, ratio, summarize
from .timing import Ready, parse_ts, read_events, read_ready, ready_ranks, wait_ready

__all__ = [
    "BASELINE", "COLLECTIVE", "LAUNCHERS", "MARKER", "REASONS", "REPO", "TORCHRUN", "WORKERS", "ExitWatch",
    "LaunchSpec", "Launcher", "Outcome", "Proc", "Ready", "Session", "Step", "Summary", "Trial", "bench_env",
    "bench_parser", "classify", "command_line", "end_agents", "failure_lines", "failure_reason", "first_failed",
    "fmt_cell", "fmt_iqr", "fmt_s", "free_port", "kill_marked", "launchers_in", "load_raw", "machine_lines",
    "marked_pids", "mbr_env", "mbr_source", "paired_ratios", "parse_ts", "pick_launchers", "plan", "publish", "ratio",
    "read_events", "read_ready", "ready_ranks", "render_raw", "rotate", "run_to_exit", "run_trials", "start",
    "stop_on_sigterm", "summarize", "table", "tool", "variant_names", "wait_ready", "with_mbr_path", "worker_argv",
    "write_raw", "write_section",
]
