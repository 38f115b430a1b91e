"""Many-agents hang worker: gloo, one tiny parameter, an optimizer step and an all_reduce every ``--interval``
seconds (mbr-launch's zero-code heartbeat is the optimizer step; the all_reduce is where the others wait).

Its generation is the number in ``--gen-file`` when it starts (the harness raises it before each hang, so the
workers of the next round read the next one). It appends ``ready <rank> <generation> <time> <pid>`` to
``--ready-file`` after its first optimizer step. Below ``--final`` it steps until the harness hangs a rank: when
``<sleep-dir>/sleep.<generation>`` appears, the rank written in it writes ``sleeping <rank> <generation> <time>
<pid>`` and sleeps an hour between two steps (outside any collective) while the others block in their next
all_reduce; for a SIGSTOP the harness stops the victim itself. Generation ``--final`` makes ``--steps`` steps
and exits 0.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--ready-file", required=True)
p.add_argument("--gen-file", required=True)
p.add_argument("--sleep-dir", required=True)
p.add_argument("--final", type=int, default=1)
p.add_argument("--interval", type=float, default=0.2)
p.add_argument("--steps", type=int, default=10)
p.add_argument("--hold", type=float, default=900.0)
args = p.parse_args()


def note(word: str) -> None:
    fd = os.open(args.ready_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, f"{word} {rank} {generation} {time.time():.6f} {os.getpid()}\n".encode())
    os.close(fd)


with open(args.gen_file) as f:
    generation = int(f.read().strip() or 0)
dist.init_process_group("gloo")
rank = dist.get_rank()
w = torch.nn.Parameter(torch.ones(1))
opt = torch.optim.SGD([w], lr=0.0)


def step() -> None:
    opt.zero_grad()
    (w * 1.0).sum().backward()
    dist.all_reduce(w.grad)
    opt.step()


# Ready once it has made an optimizer step: the zero-code step deadline runs from a rank's first step, so a
# rank stopped before any step would leave every deadline unarmed (a start-up hang, not this worker's case).
step()
note("ready")


if generation < args.final:
    trigger = os.path.join(args.sleep_dir, f"sleep.{generation}")
    end = time.monotonic() + args.hold
    while time.monotonic() < end:
        if os.path.exists(trigger):
            with open(trigger) as f:
                victim = f.read().strip()
            if victim == str(rank):
                note("sleeping")
                time.sleep(3600)
        step()
        time.sleep(args.interval)
else:
    for _ in range(args.steps):
        step()
dist.destroy_process_group()
