"""Benchmark worker for hang detection: heartbeats through the real NVRx RankMonitorClient, an all_reduce
per step, and on the first attempt one rank that stops heartbeating at a known time.

Each step: ``send_heartbeat()``, one small all_reduce (gloo), sleep ``--interval``. After the first step the
rank appends ``ready <rank> <restart> <time.time()> <pid>`` to ``--ready-file`` (the harness format).

On restart 0, rank ``--hang-rank``, ``--hang-after`` seconds after its ready line, stops at the top of a step,
before that step's heartbeat, and appends ``hang <rank> <last heartbeat time> <hang time> <pid>`` to
``--hang-file``, then sleeps. The timeout clock of a heartbeat monitor starts at the last heartbeat, so the
detection deadline is ``last heartbeat + timeout``. Its peers send one more heartbeat and block in that step's
all_reduce, so the hung rank is the first to miss its deadline (by one step).

Without ``FT_RANK_MONITOR_IPC_SOCKET`` (torchrun) there is no client: the hang is seen only when the peers'
all_reduce hits the process-group timeout ``--pg-timeout``.

On restart >= 1: ``--steps`` steps, then a clean exit 0.
"""

from __future__ import annotations

import argparse
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--ready-file", required=True)
p.add_argument("--hang-file", required=True)
p.add_argument("--hang-rank", type=int, default=1)
p.add_argument("--hang-after", type=float, default=2.0, help="seconds after the ready line")
p.add_argument("--interval", type=float, default=0.05)
p.add_argument("--steps", type=int, default=5, help="steps of a restarted attempt before exit 0")
p.add_argument("--pg-timeout", type=float, default=20.0, help="init_process_group timeout, seconds")
p.add_argument("--max-seconds", type=float, default=300.0, help="give up stepping after this (safety)")
args = p.parse_args()

restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
client = None
if os.environ.get("FT_RANK_MONITOR_IPC_SOCKET"):
    from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

    client = RankMonitorClient()
    client.init_workload_monitoring()

dist.init_process_group("gloo", timeout=timedelta(seconds=args.pg_timeout))
rank = dist.get_rank()
t = torch.ones(1)


def append(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, line.encode())
    os.close(fd)


def heartbeat() -> float:
    if client is not None:
        client.send_heartbeat()  # a request/response: the monitor has it when this returns
    return time.time()


last_hb = heartbeat()
dist.all_reduce(t)
append(args.ready_file, f"ready {rank} {restart} {time.time():.6f} {os.getpid()}\n")

hang_at = time.monotonic() + args.hang_after if restart == 0 and rank == args.hang_rank else None
end = time.monotonic() + args.max_seconds
steps = 0
while time.monotonic() < end and (restart == 0 or steps < args.steps):
    time.sleep(args.interval)
    if hang_at is not None and time.monotonic() >= hang_at:
        append(args.hang_file, f"hang {rank} {last_hb:.6f} {time.time():.6f} {os.getpid()}\n")
        time.sleep(3600)
    last_hb = heartbeat()
    dist.all_reduce(t)
    steps += 1

if client is not None:
    client.shutdown_workload_monitoring()
dist.destroy_process_group()
