"""Benchmark worker for bench_gpu_faults.py: one rank training a bf16 MLP on CUDA while it holds ``--hold-gib`` GiB
of the GPU's memory, and the faults it suffers.

Appends to ``--steps-file`` (one line each, ``time.time()`` stamps): ``start <restart> <pid> <t>`` once its memory is
held, ``step <restart> <n> <t>`` after every optimizer step, and ``hang <restart> <t>`` just before a hang.
In the first ``--faults`` attempts (``TORCHELASTIC_RESTART_COUNT`` below it):

- ``--mode crash``: steps until the bench SIGKILLs it;
- ``--mode hang``: at step ``--hang-at`` it launches a CUDA kernel that never ends and waits for it.

Later attempts make ``--last-steps`` steps and exit 0. With ``--nvrx`` (ft_launcher) every step also sends a heartbeat
through NVRx's RankMonitorClient; without it, mbr-launch sees the steps through its optimizer hook (zero-code).
"""

from __future__ import annotations

import argparse
import os
import time

import torch

p = argparse.ArgumentParser()
p.add_argument("--steps-file", required=True)
p.add_argument("--mode", choices=["crash", "hang"], required=True)
p.add_argument("--hold-gib", type=float, default=0.0)
p.add_argument("--faults", type=int, default=3)
p.add_argument("--hang-at", type=int, default=40)
p.add_argument("--last-steps", type=int, default=10)
p.add_argument("--nvrx", action="store_true")
p.add_argument("--max-seconds", type=float, default=300.0)
p.add_argument("--device", default="cuda", help="cpu: a smoke test of the bench without a GPU")
args = p.parse_args()

restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def append(line: str) -> None:
    fd = os.open(args.steps_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, (line + "\n").encode())
    os.close(fd)


client = None
if args.nvrx and os.environ.get("FT_RANK_MONITOR_IPC_SOCKET"):
    from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

    client = RankMonitorClient()
    client.init_workload_monitoring()

gpu = args.device == "cuda"
dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if gpu else torch.device("cpu")
width = 4096 if gpu else 256
if gpu:
    torch.cuda.set_device(dev)
held = torch.empty(int(args.hold_gib * (1 << 30)), dtype=torch.uint8, device=dev) if args.hold_gib and gpu else None
model = torch.nn.Sequential(*[torch.nn.Linear(width, width, dtype=torch.bfloat16, device=dev) for _ in range(4)])
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
x = torch.randn(512, width, dtype=torch.bfloat16, device=dev)


def sync() -> None:
    if gpu:
        torch.cuda.synchronize()


sync()
append(f"start {restart} {os.getpid()} {time.time():.6f}")

faulty = restart < args.faults
began = time.monotonic()
n = 0
while time.monotonic() - began < args.max_seconds:
    if faulty and args.mode == "hang" and n == args.hang_at:
        append(f"hang {restart} {time.time():.6f}")
        if gpu:
            torch.cuda._sleep(1 << 62)  # a kernel that spins on the GPU for ever
        else:
            time.sleep(1e6)
        sync()
    opt.zero_grad(set_to_none=True)
    model(x).float().square().mean().backward()
    opt.step()
    sync()
    n += 1
    if client is not None:
        client.send_heartbeat()
    append(f"step {restart} {n} {time.time():.6f}")
    if not faulty and n >= args.last_steps:
        break
    time.sleep(0.01)
