"""A plain torchrun-style training script with no resiliency code at all: gloo DDP, an MLP, SGD.

  --steps N                 optimizer steps (default 200)
  --hidden H --batch B      model width and batch: the compute of one step
  --sleep-rank R --sleep-at-step N   rank R sleeps 3600 s before step N, on the first attempt only (a hang)
  --slow-rank R             rank R does every step's forward and backward three times (a 3x slower device)
  --crash-rank R --crash-at-step N   rank R exits 1 before step N, on every attempt (a fault after progress)
  --save-every N --save PATH          rank 0 saves {"model", "opt", "step"} with torch.save every N steps
  --dcp-every N --dcp DIR             every rank saves {"model", "opt", "step"} with torch.distributed.checkpoint
                                      every N steps, and a restart resumes from the last one (dcp.load)
  --crash-once                        --crash-rank crashes on the first attempt only
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=200)
p.add_argument("--hidden", type=int, default=384)
p.add_argument("--batch", type=int, default=64)
p.add_argument("--sleep-rank", type=int, default=-1)
p.add_argument("--sleep-at-step", type=int, default=-1)
p.add_argument("--slow-rank", type=int, default=-1)
p.add_argument("--crash-rank", type=int, default=-1)
p.add_argument("--crash-at-step", type=int, default=-1)
p.add_argument("--save-every", type=int, default=0)
p.add_argument("--save", default=None)
p.add_argument("--dcp-every", type=int, default=0)
p.add_argument("--dcp", default=None)
p.add_argument("--crash-once", action="store_true")
args = p.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(args.hidden, args.hidden), torch.nn.ReLU(),
                                torch.nn.Linear(args.hidden, args.hidden), torch.nn.ReLU(),
                                torch.nn.Linear(args.hidden, 10)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(args.batch, args.hidden), torch.randint(0, 10, (args.batch,))
start = 0
if args.dcp and os.path.exists(os.path.join(args.dcp, ".metadata")):
    import torch.distributed.checkpoint as dcp

    state = {"model": model.state_dict(), "opt": opt.state_dict(), "step": 0}
    dcp.load(state, checkpoint_id=args.dcp)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    start = state["step"]
print(f"rank {rank} restart {restart} training from step {start}", flush=True)


def sleep_now(step):
    print(f"rank {rank} sleeping at step {step} at {time.time():.3f}", flush=True)
    time.sleep(3600)


for step in range(start, args.steps):
    if rank == args.sleep_rank and step == args.sleep_at_step and restart == 0:
        sleep_now(step)
    if rank == args.crash_rank and step == args.crash_at_step and not (args.crash_once and restart):
        print(f"rank {rank} crashing at step {step}", flush=True)
        os._exit(1)
    opt.zero_grad()
    if rank == args.slow_rank:
        with model.no_sync():  # the same work twice more, without another all-reduce
            for _ in range(2):
                torch.nn.functional.cross_entropy(model(x), y).backward()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    if args.save_every and (step + 1) % args.save_every == 0 and rank == 0:
        torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(), "step": step + 1}, args.save)
    if args.dcp_every and (step + 1) % args.dcp_every == 0:
        import torch.distributed.checkpoint as dcp

        dcp.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step + 1}, checkpoint_id=args.dcp)
dist.destroy_process_group()
print(f"rank {rank} restart {restart} done {args.steps} steps", flush=True)
