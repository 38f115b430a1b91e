"""A Megatron-style training script that uses NVRx's RankMonitorClient, unchanged from what it would do
under ft_launcher: heartbeats every iteration, 'setup' / 'step' / 'checkpointing' sections, and timeouts
calculated from observed intervals, saved next to the checkpoint (ft_state.json) and loaded on restart.

    mbr-launch --standalone --nproc-per-node 2 --max-restarts 2 --ft-safety-factor 20 \\
        --ft-rank-section-timeouts setup:600,step:180,checkpointing:420 \\
        --ft-rank-out-of-section-timeout 300 \\
        examples/train_megatron_style.py --iters 40 --hang-at 25

--hang-at N makes rank --hang-rank stop inside the 'step' section at iteration N on the first attempt (a
hung collective, as far as the launcher can tell): once timeouts were calculated and saved, mbr-launch
detects it within the calculated step timeout, dumps every rank's stack, and restarts; the new attempt
loads the checkpoint and the saved timeouts and finishes.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--iters", type=int, default=40)
    p.add_argument("--ckpt-every", type=int, default=10)
    p.add_argument("--ckpt-dir", default=os.environ.get("CKPT_DIR", "/tmp/mbr-megatron-style"))
    p.add_argument("--calc-after", type=int, default=16, help="calculate timeouts after this many iterations")
    p.add_argument("--hang-at", type=int, default=-1)
    p.add_argument("--hang-rank", type=int, default=1)
    args = p.parse_args()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    ckpt_dir = Path(args.ckpt_dir)
    ft_state = ckpt_dir / "ft_state.json"

    ft = RankMonitorClient()
    if ft_state.exists():
        ft.load_state_dict(json.loads(ft_state.read_text()))  # the timeouts calculated by an earlier attempt
    ft.init_workload_monitoring()

    ft.start_section("setup")
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(32, 32))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    start = 0
    if (ckpt_dir / "model.pt").exists():
        state = torch.load(ckpt_dir / "model.pt")
        model.module.load_state_dict(state["model"])
        start = state["iter"]
    ft.end_section("setup")
    if rank == 0:
        print(f"[attempt {attempt}] starting at iteration {start}; step timeout "
              f"{ft.section_timeouts.section.get('step')}", flush=True)

    for it in range(start, args.iters):
        ft.start_section("step")
        loss = model(torch.randn(16, 32)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(0.02)
        if it == args.hang_at and rank == args.hang_rank and attempt == 0:
            print(f"[attempt {attempt}] rank {rank}: hanging inside 'step' at iteration {it}", flush=True)
            time.sleep(3600)
        ft.end_section("step")
        ft.send_heartbeat()

        if (it + 1) % args.ckpt_every == 0:
            ft.start_section("checkpointing")
            if rank == 0:
                ckpt_dir.mkdir(parents=True, exist_ok=True)
                torch.save({"model": model.module.state_dict(), "iter": it + 1}, ckpt_dir / "model.pt.tmp")
                os.replace(ckpt_dir / "model.pt.tmp", ckpt_dir / "model.pt")
            dist.barrier()
            ft.end_section("checkpointing")
        if it + 1 == args.calc_after and not ft_state.exists():
            # Megatron calculates once enough iterations were observed, then saves the state (rank 0). Only
            # 'step' here: this toy loop's gaps between sections are microseconds, so a calculated
            # out-of-section (or heartbeat) timeout would fire on any scheduling hiccup.
            ft.calculate_and_set_section_timeouts(selected_sections=["step"], calc_out_of_section=False)
            if rank == 0:
                ckpt_dir.mkdir(parents=True, exist_ok=True)
                tmp = ft_state.with_suffix(".tmp")
                tmp.write_text(json.dumps(ft.state_dict()))
                tmp.replace(ft_state)
                print(f"[attempt {attempt}] calculated timeouts: step {ft.section_timeouts.section['step']:.2f} s",
                      flush=True)
    dist.barrier()
    if rank == 0:
        print(f"[attempt {attempt}] finished {args.iters} iterations", flush=True)
    ft.shutdown_workload_monitoring()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
