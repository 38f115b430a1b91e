"""One training-like worker for every hang scenario of the hang verdict (issue #14).

Each step: (nvrx) open section 'step' and heartbeat; fetch a batch from a DataLoader; forward/backward of a
tiny model; all_reduce the gradients; optimizer.step(); (nvrx) close 'step'; sleep --interval. On the first
attempt, at step --hang-step, rank --culprit goes wrong *inside* the step, after the heartbeat and before the
step's all_reduce, so its peers block in that all_reduce: every rank's last heartbeat, open section and step
count look alike, which is the case a deadline alone cannot tell apart.

  --scenario sleep               time.sleep between the backward and the all_reduce
             sigstop             os.kill(getpid(), SIGSTOP) there
             busy                a pure-Python busy loop holding the GIL there
             dataloader          the batch's Dataset.__getitem__ blocks (num_workers=0: in the main process)
             dataloader_workers  the same with num_workers=2 (the main process waits in DataLoader.__next__)
             other_collective    the culprit enters a barrier on a second process group while its peers are
                                 in the default group's all_reduce (a different collective)
             crash_cascade       the culprit raises; its peers then die of gloo "Connection closed by peer"
             none                no fault
  --client nvrx|none             nvrx: NVRx RankMonitorClient, section 'step' around each step + a heartbeat
                                 per step (as Megatron does); none: nothing (the launcher's autobeat counts
                                 optimizer steps for --step-timeout)
  --device cpu|cuda              cpu: gloo; cuda: nccl on cuda:LOCAL_RANK (a second group: gloo for barrier)
  --ready-file F                 append "ready RANK RESTART TIME PID" after the first step (harness format)
  --hang-file F                  the culprit appends "hang RANK TIME PID SCENARIO" as the fault starts
  --pg-timeout S                 the process-group timeout (what torchrun has to go by)

--scenario and --culprit may be comma-separated lists, one item per attempt (TORCHELASTIC_RESTART_COUNT): one
launch goes through several scenarios, a restart after each (a shorter --culprit list repeats its last item).
Attempts past the list make --steps steps without a fault and exit 0.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from datetime import timedelta

import torch
import torch.distributed as dist

SCENARIOS = ("sleep", "sigstop", "busy", "dataloader", "dataloader_workers", "other_collective", "crash_cascade",
             "stall_all", "none")

p = argparse.ArgumentParser()
p.add_argument("--scenario", required=True, help="one of SCENARIOS, or a comma-separated list: one per attempt")
p.add_argument("--culprit", default="1", help="a rank, or a comma-separated list: one per attempt")
p.add_argument("--client", choices=("nvrx", "none"), default="none")
p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
p.add_argument("--hang-step", type=int, default=30, help="the step at which the culprit goes wrong (~1.5 s in)")
p.add_argument("--interval", type=float, default=0.05, help="seconds slept per step (outside the section)")
p.add_argument("--steps", type=int, default=5, help="steps of a fault-free attempt before exit 0")
p.add_argument("--ready-file")
p.add_argument("--hang-file")
p.add_argument("--pg-timeout", type=float, default=600.0)
args = p.parse_args()

restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
rank = int(os.environ["RANK"])
scenarios = args.scenario.split(",")
if unknown := [s for s in scenarios if s not in SCENARIOS]:
    p.error(f"--scenario {','.join(unknown)}: choose from {', '.join(SCENARIOS)}")
culprits = [int(c) for c in args.culprit.split(",")]
scenario = scenarios[restart] if restart < len(scenarios) else "none"  # this attempt's
culprit = culprits[min(restart, len(culprits) - 1)]
faulty = rank == culprit and scenario != "none"
total = args.hang_step + 1000 if scenario != "none" else args.steps

client = None
if args.client == "nvrx":
    from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

    client = RankMonitorClient()
    client.init_workload_monitoring()

timeout = timedelta(seconds=args.pg_timeout)
if args.device == "cuda":
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device, timeout=timeout)
else:
    device = torch.device("cpu")
    dist.init_process_group("gloo", timeout=timeout)
# Made by every rank up front (new_group is itself collective); only other_collective uses it.
side_group = dist.new_group(backend="gloo", timeout=timeout)


def append(path: str | None, line: str) -> None:
    if path:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(fd, line.encode())
        os.close(fd)


def announce() -> None:
    print(f"rank {rank} hanging: {scenario} at {time.time():.3f}", flush=True)
    append(args.hang_file, f"hang {rank} {time.time():.6f} {os.getpid()} {scenario}\n")


class Batches(torch.utils.data.Dataset):
    """Random batches; on the culprit, every item of batch --hang-step or later blocks (a stuck read)."""

    def __len__(self) -> int:
        return total

    def __getitem__(self, index: int) -> torch.Tensor:
        if faulty and scenario.startswith("dataloader") and index >= args.hang_step:
            time.sleep(3600)
        return torch.randn(8, 16, generator=torch.Generator().manual_seed(index))


def stall_everywhere() -> None:
    """stall_all: every rank, not one culprit, sleeps here outside any collective (a checkpoint write to a stuck
    file system looks like this)."""
    announce()
    time.sleep(3600)


def stuck_in_step() -> None:
    """The fault, between the backward and the all_reduce: peers are already waiting in that all_reduce."""
    announce()
    if scenario == "sleep":
        time.sleep(3600)
    elif scenario == "sigstop":
        os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(3600)  # if someone resumes it, it stays out of the collective
    elif scenario == "busy":
        x = 0
        while True:  # holds the GIL: no Python thread of this process runs
            x += 1
    elif scenario == "other_collective":
        dist.barrier(group=side_group)  # the peers never enter it: they wait in all_reduce
        time.sleep(3600)
    elif scenario == "crash_cascade":
        raise RuntimeError(f"rank {rank}: injected crash at step {args.hang_step}")


torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
workers = 2 if scenario == "dataloader_workers" else 0
loader = torch.utils.data.DataLoader(Batches(), batch_size=None, num_workers=workers)
print(f"rank {rank} restart {restart} scenario {scenario} client {args.client}", flush=True)

batches = iter(loader)
for step in range(total):
    if client is not None:
        client.start_section("step")
        client.send_heartbeat()
    if faulty and step == args.hang_step and scenario.startswith("dataloader"):
        announce()  # the next fetch never returns
    x = next(batches).to(device)
    opt.zero_grad()
    model(x).square().mean().backward()
    if faulty and step == args.hang_step:
        stuck_in_step()
    if scenario == "stall_all" and step == args.hang_step:
        stall_everywhere()
    grads = torch.cat([q.grad.flatten() for q in model.parameters()])
    dist.all_reduce(grads)
    offset = 0
    for q in model.parameters():
        q.grad.copy_(grads[offset:offset + q.numel()].view_as(q) / dist.get_world_size())
        offset += q.numel()
    opt.step()
    if client is not None:
        client.end_section("step")
    if step == 0:
        append(args.ready_file, f"ready {rank} {restart} {time.time():.6f} {os.getpid()}\n")
    time.sleep(args.interval)

if client is not None:
    client.shutdown_workload_monitoring()
dist.destroy_process_group()
print(f"rank {rank} restart {restart} done {total} steps", flush=True)
