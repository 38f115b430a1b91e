"""A training script reduced to what progress tracking sees (standard library only: starts in milliseconds).

Every rank prints a line to stdout and one to stderr (with NVRX_CURRENT_CYCLE_INFO). Then rank 0 waits until
every other rank has printed its lines (marker files beside the iteration file) and crashes (exit 1); the
others wait to be stopped. So each cycle's output is complete, whichever rank the launcher hears from first.

  --iter-file F        the checkpoint iteration file
  --advance-in C,..    in these cycles (TORCHELASTIC_RESTART_COUNT), rank 0 "checkpoints" 10 more iterations
  --succeed-in C       in this cycle every rank exits 0 instead
"""
import argparse
import os
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("--iter-file", required=True)
p.add_argument("--advance-in", default="")
p.add_argument("--succeed-in", type=int, default=-1)
args = p.parse_args()

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
cycle = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
print(f"rank {rank} cycle {cycle} starts", flush=True)
print(f"rank {rank} cycle info {os.environ.get('NVRX_CURRENT_CYCLE_INFO')}", file=sys.stderr, flush=True)
marker = f"{args.iter_file}.printed.{cycle}."
if rank == 0 and str(cycle) in args.advance_in.split(","):
    with open(args.iter_file) as f:
        value = int(f.read())
    with open(args.iter_file + ".tmp", "w") as f:
        f.write(f"{value + 10}\n")
    os.replace(args.iter_file + ".tmp", args.iter_file)
if cycle == args.succeed_in:
    sys.exit(0)
if rank != 0:
    open(marker + str(rank), "w").close()
    time.sleep(120)  # stopped by the launcher when rank 0 crashes
deadline = time.monotonic() + 60
while not all(os.path.exists(marker + str(r)) for r in range(1, world)) and time.monotonic() < deadline:
    time.sleep(0.02)
sys.exit(1)
