"""Goodput worker: a small data-parallel training run that checkpoints and resumes, the way a real job does.

gloo DDP (or NCCL with ``--gpu``), an MLP and SGD; each step is the forward/backward plus ``--step-time``
seconds of simulated device work. Rank 0 saves model, optimizer and step every ``--ckpt-every`` steps
(write to a temporary file, then rename: a kill mid-save never leaves a torn checkpoint); every (re)start
resumes from the last checkpoint, so the steps done since then are lost, as in real training.

``--no-optimizer``: no DDP and no ``torch.optim``: the gradients are all-reduced by hand (one
``dist.all_reduce`` per parameter) and averaged, and the parameters updated in place (plain SGD). The same
training, but no optimizer step for mbr-launch's step heartbeat to see: only its collectives and checkpoints
show that it trains (issue #28: such a run was taken for a crash loop and backed off).

Files:
- ``--ready-file``: ``ready <rank> <restart> <time> <pid>`` after the first step of each start (the same
  format as workers/collective.py, so the harness can find the pids to kill);
- ``--progress-file``: rank 0 appends ``step <n> <restart> <time>`` after every step;
- ``--stop-file``: when it exists, the ranks agree (a MAX all_reduce of a flag every step, so both stop at
  the same step) to save a last checkpoint and exit 0.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import pg  # workers/pg.py (the script's folder is first on sys.path)
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--ready-file", required=True)
p.add_argument("--progress-file", required=True)
p.add_argument("--stop-file", required=True)
p.add_argument("--ckpt", required=True, help="checkpoint path (rank 0 writes it, every rank reads it)")
p.add_argument("--ckpt-every", type=int, default=20)
p.add_argument("--step-time", type=float, default=0.05, help="simulated device work per step (seconds)")
p.add_argument("--hidden", type=int, default=64)
p.add_argument("--gpu", action="store_true")
p.add_argument("--no-optimizer", action="store_true", help="all-reduce gradients by hand, update without torch.optim")
p.add_argument("--lr", type=float, default=0.01)
args = p.parse_args()

restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
device = pg.init(args.gpu, "goodput_train.py")
rank = dist.get_rank()
world = dist.get_world_size()
torch.manual_seed(0)  # the same initial parameters on every rank
net = torch.nn.Sequential(torch.nn.Linear(args.hidden, args.hidden), torch.nn.ReLU(), torch.nn.Linear(args.hidden, 10))
net = net.to(device)
if args.no_optimizer:
    model, opt = net, None
else:
    model = DDP(net, device_ids=[device.index] if args.gpu else None)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
x = torch.randn(32, args.hidden, device=device)
y = torch.randint(0, 10, (32,), device=device)
ckpt = Path(args.ckpt)
step = 0
if ckpt.exists():
    state = torch.load(ckpt, map_location=device)
    net.load_state_dict(state["model"])
    if opt is not None and "opt" in state:
        opt.load_state_dict(state["opt"])
    step = state["step"]


def save() -> None:
    if rank == 0:
        tmp = ckpt.with_suffix(".tmp")
        state = {"model": net.state_dict(), "step": step}
        if opt is not None:
            state["opt"] = opt.state_dict()
        torch.save(state, tmp)
        os.replace(tmp, ckpt)


def append(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, line.encode())  # one write on an O_APPEND file: lines never interleave
    os.close(fd)


flag = torch.zeros(1, device=device)
ready = False
def train_step() -> None:
    if opt is not None:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        return
    net.zero_grad()
    torch.nn.functional.cross_entropy(net(x), y).backward()
    with torch.no_grad():
        for param in net.parameters():
            dist.all_reduce(param.grad)  # summed over the ranks: divided into the mean in the update
            param.add_(param.grad, alpha=-args.lr / world)


while True:
    train_step()
    time.sleep(args.step_time)
    step += 1
    now = time.time()
    if rank == 0:
        append(args.progress_file, f"step {step} {restart} {now:.6f}\n")
    if step % args.ckpt_every == 0:
        save()
    if not ready:
        ready = True
        append(args.ready_file, f"ready {rank} {restart} {now:.6f} {os.getpid()}\n")
    flag.fill_(1.0 if os.path.exists(args.stop_file) else 0.0)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if flag.item() > 0:
        break
save()
dist.barrier()
dist.destroy_process_group()
