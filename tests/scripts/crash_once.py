"""Optimizer steps with no process group (fast to start), and one crash: for the run report's tests.

  --steps N --step-time T      N SGD steps of about T seconds each, on every rank
  --crash-rank R --crash-at-step K   rank R exits 3 before step K, on the first attempt only
"""
import argparse
import os
import time

import torch

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=40)
p.add_argument("--step-time", type=float, default=0.02)
p.add_argument("--crash-rank", type=int, default=-1)
p.add_argument("--crash-at-step", type=int, default=-1)
args = p.parse_args()

rank = int(os.environ["RANK"])
restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(16, 8)
for step in range(args.steps):
    if rank == args.crash_rank and step == args.crash_at_step and restart == 0:
        print(f"rank {rank} crashing at step {step}", flush=True)
        os._exit(3)
    opt.zero_grad()
    model(x).pow(2).mean().backward()
    opt.step()
    time.sleep(args.step_time)
print(f"rank {rank} restart {restart} done", flush=True)
