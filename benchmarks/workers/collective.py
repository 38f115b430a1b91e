"""Benchmark worker: init a process group, one all_reduce, report readiness, then optionally keep stepping.

Appends one line per rank to ``--ready-file`` right after the first all_reduce completes::

    ready <rank> <restart> <time.time()> <pid>

(one ``write`` on an O_APPEND file, so concurrent ranks never interleave). Then:

- ``--hold S`` > 0 on restart 0: small all_reduces every ``--interval`` seconds for up to S seconds, so a
  sibling's death is noticed through the collective as well as through its process exit;
- on restart >= 1, or with ``--hold 0``: ``--steps`` all_reduces, then a clean exit 0.

``--gpu``: NCCL on ``cuda:LOCAL_RANK``; exits 2 when CUDA is not available (a benchmark must not silently
fall back to another backend). Otherwise gloo on CPU tensors.
"""

from __future__ import annotations

import argparse
import os
import time

import pg  # workers/pg.py (the script's folder is first on sys.path)
import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--ready-file", required=True)
p.add_argument("--hold", type=float, default=0.0, help="seconds of stepping on restart 0")
p.add_argument("--interval", type=float, default=0.05)
p.add_argument("--steps", type=int, default=3, help="all_reduces before a clean exit")
p.add_argument("--gpu", action="store_true")
args = p.parse_args()

restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
device = pg.init(args.gpu, "collective.py")
rank = dist.get_rank()
t = torch.ones(1, device=device)
dist.all_reduce(t)
if device.type == "cuda":
    torch.cuda.synchronize(device)
line = f"ready {rank} {restart} {time.time():.6f} {os.getpid()}\n".encode()
fd = os.open(args.ready_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
os.write(fd, line)
os.close(fd)

if restart == 0 and args.hold > 0:
    deadline = time.monotonic() + args.hold
    while time.monotonic() < deadline:
        time.sleep(args.interval)
        dist.all_reduce(t)
else:
    for _ in range(args.steps):
        dist.all_reduce(t)
if device.type == "cuda":
    torch.cuda.synchronize(device)
dist.destroy_process_group()
