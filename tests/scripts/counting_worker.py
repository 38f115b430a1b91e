"""A worker that only counts, for the restart-policy tables (tests/test_node_leaves.py), shaped as NVRx's own
functional tests of ft_launcher's restart policies describe theirs: no collectives, so its life depends on
nothing but its launcher.

  --runs-file F   rank 0 appends a line at its start: the job's runs are the file's lines
  --live-file F   every rank appends "+1 RANK PID" at its start and "-1 RANK PID WHY" when it ends (on SIGTERM,
                  SIGUSR1, SIGUSR2, or its time limit): the live ranks are the sum of the first fields
  --max-time S    its time limit, from its start
  --end-file F    ... or as soon as F exists (a time limit the test sets, the same moment for every run)

It exits 0 when a signal ends it (as a script that checkpoints on SIGTERM and leaves), 0 at its time limit.
Lines are appended with one write(2) each, on O_APPEND: several processes never tear each other's lines.
"""
import argparse
import os
import signal
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("--runs-file", required=True)
p.add_argument("--live-file", required=True)
p.add_argument("--max-time", type=float, default=600.0)
p.add_argument("--end-file", default=None)
args = p.parse_args()
rank = int(os.environ["RANK"])


def append(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


def leave(why: str) -> None:
    append(args.live_file, f"-1 {rank} {os.getpid()} {why}")
    sys.exit(0)


def on_signal(signum: int, _frame: object) -> None:
    for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):  # count the end once, whatever comes next
        signal.signal(sig, signal.SIG_IGN)
    leave(signal.Signals(signum).name)


for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):
    signal.signal(sig, on_signal)
if rank == 0:
    append(args.runs_file, f"run {os.getpid()}")
append(args.live_file, f"+1 {rank} {os.getpid()}")
deadline = time.monotonic() + args.max_time
while time.monotonic() < deadline and not (args.end_file and os.path.exists(args.end_file)):
    time.sleep(0.1)
leave("time limit")
