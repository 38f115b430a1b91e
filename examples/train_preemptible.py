"""A preemptible training script: on SIGTERM every rank stops at the same step and rank 0 saves a checkpoint.

mbr-launch answers a preemption signal (scancel, srun --signal=USR1@60) by sending the workers SIGTERM,
waiting --preempt-grace seconds, then SIGKILL. The handler only sets a flag; once per step the ranks
all_reduce that flag, so all of them stop after the same step even when the signal reaches them at
different moments. A restarted or requeued job resumes from the checkpoint.

    srun --kill-on-bad-exit=0 mbr-launch --nproc-per-node 2 --requeue-on-preemption \\
        examples/train_preemptible.py --ckpt-dir $SLURM_SUBMIT_DIR/ckpt

--log FILE appends what happened ("<rank> <event> ...") for tests; --note-signal-rank R makes rank R
record (and survive) the SIGUSR1s it receives, where the others keep the launcher's SIG_IGN.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist

stop_requested = False


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--step-time", type=float, default=0.05, help="extra seconds per step (simulated compute)")
    p.add_argument("--ckpt-dir", default=os.environ.get("CKPT_DIR", "/tmp/mbr-example-ckpt"))
    p.add_argument("--log", default=None)
    p.add_argument("--note-signal-rank", type=int, default=-1)
    args = p.parse_args()
    rank = int(os.environ["RANK"])

    def note(what: str) -> None:
        if args.log:
            with open(args.log, "a") as fh:
                fh.write(f"{rank} {what} pid={os.getpid()} node={os.uname().nodename} t={time.time():.3f}\n")

    def on_term(signum: int, _frame: object) -> None:
        global stop_requested
        stop_requested = True
        note(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_term)
    if rank == args.note_signal_rank:
        signal.signal(signal.SIGUSR1, lambda signum, _frame: note("SIGUSR1"))

    dist.init_process_group("gloo")
    torch.manual_seed(0)  # the same initial weights on every rank
    model = torch.nn.Linear(8, 1)
    ckpt = Path(args.ckpt_dir) / "latest.pt"
    start = 0
    if ckpt.exists():
        state = torch.load(ckpt)
        model.load_state_dict(state["model"])
        start = state["step"]
        note(f"resumed step={start}")
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(start, args.steps):
        x = torch.randn(16, 8)
        loss = (model(x).squeeze(1) - x.sum(1)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        for param in model.parameters():
            dist.all_reduce(param.grad)
            param.grad /= dist.get_world_size()
        opt.step()
        time.sleep(args.step_time)
        if step == start:  # the first step is slow (gloo connects): only now is the training under way
            usr1 = signal.getsignal(signal.SIGUSR1)
            note(f"running usr1={getattr(usr1, 'name', 'handler')} "
                 f"slurm_restart={os.environ.get('SLURM_RESTART_COUNT', '0')}")
        stop = torch.tensor([float(stop_requested)])
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        if stop.item():
            if rank == 0:
                ckpt.parent.mkdir(parents=True, exist_ok=True)
                torch.save({"model": model.state_dict(), "step": step + 1}, ckpt.with_suffix(".tmp"))
                ckpt.with_suffix(".tmp").replace(ckpt)
            note(f"checkpoint step={step + 1}")
            dist.destroy_process_group()
            return
    note(f"finished step={args.steps}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
