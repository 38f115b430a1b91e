"""A plain torchrun-style training script (no resiliency code): linear regression with DDP on CPU (gloo).

It checkpoints every --ckpt-every steps to --ckpt-dir and resumes from the newest checkpoint, so a restart
continues where the job stopped. --fault-step N injects a crash: rank --fault-rank SIGKILLs itself at step
N, on the first attempt only (TORCHELASTIC_RESTART_COUNT == 0).

    mbr-launch --standalone --nproc-per-node 2 --max-restarts 2 examples/train_plain.py --fault-step 30
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--step-time", type=float, default=0.02, help="extra seconds per step (simulated compute)")
    p.add_argument("--ckpt-dir", default=os.environ.get("CKPT_DIR", "/tmp/mbr-example-ckpt"))
    p.add_argument("--ckpt-every", type=int, default=10)
    p.add_argument("--fault-step", type=int, default=-1)
    p.add_argument("--fault-rank", type=int, default=1)
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    true_w = torch.arange(16, dtype=torch.float32) / 16

    ckpt_dir = Path(args.ckpt_dir)
    ckpt = ckpt_dir / "latest.pt"
    start = 0
    if ckpt.exists():
        state = torch.load(ckpt)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"]
        if rank == 0:
            print(f"[attempt {attempt}] resumed from step {start}", flush=True)

    gen = torch.Generator().manual_seed(1000 + rank)
    loss = torch.tensor(0.0)
    for step in range(start, args.steps):
        x = torch.randn(32, 16, generator=gen)
        y = x @ true_w + 0.01 * torch.randn(32, generator=gen)
        loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(args.step_time)
        if step == args.fault_step and rank == args.fault_rank and attempt == 0:
            print(f"[attempt {attempt}] rank {rank}: injecting a crash at step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        if (step + 1) % args.ckpt_every == 0 and rank == 0:
            ckpt_dir.mkdir(parents=True, exist_ok=True)
            tmp = ckpt.with_suffix(".tmp")
            torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(), "step": step + 1}, tmp)
            tmp.replace(ckpt)  # atomic: a crash mid-save never leaves a torn checkpoint
        if rank == 0 and step % 10 == 0:
            print(f"[attempt {attempt}] step {step} loss {loss.item():.4f}", flush=True)
    dist.barrier()
    if rank == 0:
        print(f"[attempt {attempt}] finished {args.steps} steps on {world} ranks, final loss {loss.item():.4f}",
              flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
