"""A tiny gloo job driven by flags, for launcher tests.

  --crash-rank R[,R] --crash-on-restart N  ranks R SIGKILL themselves after the first all_reduce on restart N
  --exit-rank R --exit-code C           rank R exits with C (on every restart unless --crash-on-restart)
  --steps S --step-time T                S all_reduce steps of T seconds
  --ready-file F                         append "rank restart time" after the first all_reduce
  --fault-file F                         append "rank restart time" just before an injected crash or exit
  --sleep-forever-rank R                 rank R sleeps after init (a hang)
"""
import argparse
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--crash-rank", default="", help="comma-separated ranks")
p.add_argument("--crash-on-restart", type=int, default=0)
p.add_argument("--exit-rank", type=int, default=-1)
p.add_argument("--exit-code", type=int, default=1)
p.add_argument("--steps", type=int, default=3)
p.add_argument("--step-time", type=float, default=0.05)
p.add_argument("--ready-file", default=None)
p.add_argument("--fault-file", default=None)
p.add_argument("--expect-world", type=int, default=0)
p.add_argument("--term-file", default=None, help="on SIGTERM, append 'rank' here and exit 0")
args = p.parse_args()

if args.term_file:
    def on_term(signum, frame):
        with open(args.term_file, "a") as f:
            f.write(f"{os.environ['RANK']} {signal.Signals(signum).name}\n")
        sys.exit(0)
    signal.signal(signal.SIGTERM, on_term)

restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
dist.init_process_group("gloo")
rank = dist.get_rank()
if args.expect_world:
    assert dist.get_world_size() == args.expect_world, dist.get_world_size()
t = torch.ones(1)
dist.all_reduce(t)
if args.ready_file:
    with open(args.ready_file, "a") as f:
        f.write(f"{rank} {restart} {time.time()}\n")
print(f"rank {rank} ready restart {restart} world {int(t.item())}", flush=True)


def fault_now() -> None:
    if args.fault_file:
        with open(args.fault_file, "a") as f:
            f.write(f"{rank} {restart} {time.time()}\n")


if str(rank) in args.crash_rank.split(",") and restart == args.crash_on_restart:
    fault_now()
    os.kill(os.getpid(), signal.SIGKILL)
if rank == args.exit_rank:
    # Tear the group down first: exiting with a live gloo group can abort in C++ teardown ("terminate called
    # without an active exception", SIGABRT) about one run in ten, and the exit code would be lost.
    dist.destroy_process_group()
    fault_now()
    sys.exit(args.exit_code)
for _ in range(args.steps):
    time.sleep(args.step_time)
    dist.all_reduce(t)
dist.destroy_process_group()
print(f"rank {rank} done", flush=True)
