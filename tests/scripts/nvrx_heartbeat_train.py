"""A small gloo training loop that heartbeats through whatever NVRx RankMonitorClient is importable (0.4.1, 0.6,
0.7), as a script launched by NeMo-Run's ft_launcher component does.

  --steps N              steps of: all_reduce, heartbeat (default 30)
  --crash-rank R         rank R exits 3 at step --crash-at-step, on the first attempt only
  --stop-rank R          rank R SIGSTOPs itself at --crash-at-step, on the first attempt only (a hang)
  --sections             also wrap each step in section "step" (which must then have a timeout)
"""
import argparse
import os
import signal
import time

import torch
import torch.distributed as dist
from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=30)
p.add_argument("--crash-rank", type=int, default=-1)
p.add_argument("--stop-rank", type=int, default=-1)
p.add_argument("--crash-at-step", type=int, default=10)
p.add_argument("--step-time", type=float, default=0.02)
p.add_argument("--sections", action="store_true", help="wrap each step in section \"step\"")
args = p.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
client = RankMonitorClient()
client.init_workload_monitoring()
t = torch.ones(4)
for step in range(args.steps):
    if attempt == 0 and step == args.crash_at_step:
        if rank == args.crash_rank:
            print(f"rank {rank} crashing at step {step}", flush=True)
            os._exit(3)
        if rank == args.stop_rank:
            print(f"rank {rank} stopping itself at step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)
    if args.sections:
        client.start_section("step")
    dist.all_reduce(t)
    time.sleep(args.step_time)
    if args.sections:
        client.end_section("step")
    client.send_heartbeat()
print(f"rank {rank}: finished {args.steps} steps on attempt {attempt}", flush=True)
client.shutdown_workload_monitoring()
dist.destroy_process_group()
