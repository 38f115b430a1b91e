"""A worker with no collectives, for restart-scope tests: its life does not depend on its peers.

  --ready-file F       append "RANK RESTART PID TIME" at start
  --crash R:N,...      rank R exits 1 after --crash-after seconds when TORCHELASTIC_RESTART_COUNT is N
  --crash-if-env VAR   exit 1 (after --crash-after) whenever VAR is set in the environment
  --run-seconds S      then exit 0
  --child-file F       first start a child process (sleep 600, in this worker's process group) and append
                       "RANK PID CHILD_PID" to F
  --ignore-term        ignore SIGTERM (the child too): only SIGKILL stops them
  --ignore-int         ignore SIGINT too (a script that catches Ctrl-C to clean up slowly)
"""
import argparse
import os
import signal
import subprocess
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("--ready-file")
p.add_argument("--crash", default="")
p.add_argument("--crash-if-env", default=None)
p.add_argument("--crash-after", type=float, default=0.5)
p.add_argument("--child-file", default=None)
p.add_argument("--ignore-term", action="store_true")
p.add_argument("--ignore-int", action="store_true")
p.add_argument("--run-seconds", type=float, default=3.0)
args = p.parse_args()
rank, restart = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
if args.ignore_term:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # inherited by the child: ignored dispositions survive exec
if args.ignore_int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
if args.child_file:
    child = subprocess.Popen(["sleep", "600"])
    with open(args.child_file, "a") as f:
        f.write(f"{rank} {os.getpid()} {child.pid}\n")
if args.ready_file:
    with open(args.ready_file, "a") as f:
        f.write(f"{rank} {restart} {os.getpid()} {time.time()}\n")
crash = f"{rank}:{restart}" in args.crash.split(",") or bool(args.crash_if_env and os.environ.get(args.crash_if_env))
if crash:
    time.sleep(args.crash_after)
    sys.exit(1)
time.sleep(args.run_seconds)
