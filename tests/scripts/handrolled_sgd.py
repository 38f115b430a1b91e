"""Training without torch.optim: gloo, an MLP, gradients all-reduced by hand, parameters updated in place, a
torch.save checkpoint now and then. No optimizer step, so the automatic step heartbeat sees no step; its
collectives and checkpoints are the only signs that it trains.

  --plan A,B,...      what attempt k (TORCHELASTIC_RESTART_COUNT) does; attempts past the list do "ok":
                        startup: rank --die-rank exits 1 right after importing torch (no collective made)
                        train:   train for --train-seconds, then rank --die-rank SIGKILLs itself
                        ok:      train --steps steps and exit 0
  --save PATH --save-every N    rank 0 saves {"model", "step"} with torch.save every N steps
"""
import argparse
import os
import signal
import time

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--plan", default="")
p.add_argument("--die-rank", type=int, default=1)
p.add_argument("--train-seconds", type=float, default=3.0)
p.add_argument("--steps", type=int, default=20)
p.add_argument("--hidden", type=int, default=32)
p.add_argument("--save", default=None)
p.add_argument("--save-every", type=int, default=10)
args = p.parse_args()

restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
plan = [a for a in args.plan.split(",") if a]
todo = plan[restart] if restart < len(plan) else "ok"
rank = int(os.environ["RANK"])
if todo == "startup" and rank == args.die_rank:
    print(f"rank {rank} restart {restart} dying at start-up", flush=True)
    raise SystemExit(1)

dist.init_process_group("gloo")
world = dist.get_world_size()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(args.hidden, args.hidden), torch.nn.ReLU(), torch.nn.Linear(args.hidden, 4))
for param in model.parameters():  # the same start everywhere, as DDP would
    dist.broadcast(param.data, 0)
x, y = torch.randn(16, args.hidden), torch.randint(0, 4, (16,))
print(f"rank {rank} restart {restart} training ({todo})", flush=True)
started = time.monotonic()
step = 0
while True:
    model.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    with torch.no_grad():
        for param in model.parameters():
            dist.all_reduce(param.grad)
            param.add_(param.grad, alpha=-0.01 / world)
    step += 1
    if args.save and step % args.save_every == 0 and rank == 0:
        torch.save({"model": model.state_dict(), "step": step}, args.save)
    if todo == "train" and rank == args.die_rank and time.monotonic() - started >= args.train_seconds:
        print(f"rank {rank} restart {restart} killed after {step} steps", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    if todo != "train" and step >= args.steps:  # the others train on until the launcher stops them
        break
    time.sleep(0.005)
dist.destroy_process_group()
print(f"rank {rank} restart {restart} done {step} steps", flush=True)
