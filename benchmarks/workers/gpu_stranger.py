"""A process that is not of the job (bench_gpu_faults.py starts it, no launcher does): it holds ``--gib`` GiB of
GPU 0 and keeps a kernel spinning, as a worker an earlier run left behind does. Appends ``holding <pid> <t>`` to
``--ready-file`` once the memory is held."""

from __future__ import annotations

import argparse
import os
import time

import torch

p = argparse.ArgumentParser()
p.add_argument("--ready-file", required=True)
p.add_argument("--gib", type=float, default=2.22)  # 2.22 GiB: the 2,383 MB of the stranger
p.add_argument("--max-seconds", type=float, default=900.0)
args = p.parse_args()

held = torch.empty(int(args.gib * (1 << 30)), dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
with open(args.ready_file, "a") as f:
    f.write(f"holding {os.getpid()} {time.time():.6f}\n")
began = time.monotonic()
while time.monotonic() - began < args.max_seconds:
    torch.cuda._sleep(200_000_000)  # about 0.1 s of one SM spinning
    torch.cuda.synchronize()
