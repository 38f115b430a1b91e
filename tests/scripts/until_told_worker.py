"""A gloo job that steps until told: an optimizer step and an all_reduce every ``--interval`` seconds; it
appends ``ready <rank> <pid>`` to ``--ready-file`` after its first step, and all ranks stop together (the
flag is all-reduced) once ``--finish-file`` exists, then exit 0."""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--ready-file", required=True)
p.add_argument("--finish-file", required=True)
p.add_argument("--interval", type=float, default=0.2)
args = p.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
w = torch.nn.Parameter(torch.ones(1))
opt = torch.optim.SGD([w], lr=0.0)
first = True
while True:
    opt.zero_grad()
    (w * 1.0).sum().backward()
    dist.all_reduce(w.grad)
    opt.step()
    if first:
        fd = os.open(args.ready_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(fd, f"ready {rank} {os.getpid()}\n".encode())
        os.close(fd)
        first = False
    done = torch.tensor([1.0 if os.path.exists(args.finish_file) else 0.0])
    dist.all_reduce(done, op=dist.ReduceOp.MAX)
    if done.item():
        break
    time.sleep(args.interval)
dist.destroy_process_group()
