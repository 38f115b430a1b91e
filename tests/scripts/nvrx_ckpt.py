"""Plain gloo DDP training that checkpoints through NVRx's own checkpointing, on CPU.

  --mode async   every rank schedules torch.save of its state through NVRx's AsyncCallsQueue (the persistent,
                 spawned writer that Megatron uses) and finalizes it on later steps (no_dist: the collective
                 form puts a flag on the current CUDA device)
  --mode local   every rank saves through NVRx's LocalCheckpointManager; its BasicTensorAwareStateDict holds
                 CUDA tensors only, so a CPU one is declared here (the manager's save, finalize, rename and
                 load are NVRx's)
  --cuda         the model on the GPUs (rank % GPUs): async through NVRx's TorchAsyncCheckpoint, local with its
                 BasicTensorAwareStateDict (both need CUDA)
  --every N --dir DIR   a checkpoint every N steps; a restart resumes from the last finalized one
  --steps N --crash-rank R --crash-at-step S   rank R exits 1 before step S on the first attempt
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist
from nvidia_resiliency_ext.checkpointing.local.base_state_dict import TensorAwareStateDict
from torch.nn.parallel import DistributedDataParallel as DDP


class CpuStateDict(TensorAwareStateDict):
    """Tensors kept apart from the rest, as NVRx's basic state dict keeps them, on CPU."""

    def __init__(self, sd):
        self.keys, self.values = list(sd["model"]), list(sd["model"].values())
        self.step = sd["step"]

    def pop_tensors(self):
        values, self.values = self.values, []
        return values

    @property
    def tensors(self):
        return iter(self.values)

    def is_hollow(self):
        return not self.values

    def insert_tensors(self, tensor_data):
        self.values = list(tensor_data)

    def init_tensors(self):
        pass

    def copy_tensors_to_cpu(self, non_blocking=False):
        pass

    def restore_tensor_device(self, non_blocking=True):
        pass

    def to_state_dict(self):
        return {"model": dict(zip(self.keys, self.values)), "step": self.step}


def main():
    # Under a main guard: NVRx's persistent writer is a spawned process, which imports this module again.
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=("async", "local"), required=True)
    p.add_argument("--every", type=int, default=10)
    p.add_argument("--dir", required=True)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--crash-rank", type=int, default=-1)
    p.add_argument("--crash-at-step", type=int, default=-1)
    p.add_argument("--cuda", action="store_true")
    args = p.parse_args()

    os.makedirs(args.dir, exist_ok=True)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    device = torch.device(f"cuda:{rank % torch.cuda.device_count()}" if args.cuda else "cpu")
    if args.cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10)).to(device)
    model = DDP(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 32, device=device), torch.randint(0, 10, (16,), device=device)

    def state(step):
        return {"model": model.module.state_dict(), "step": step}

    if args.mode == "async":
        path = os.path.join(args.dir, f"rank{rank}.pt")
        if args.cuda:
            # NVRx's torch.save wrapper: tensors to host, then its asynchronous writer
            from nvidia_resiliency_ext.checkpointing.async_ckpt.torch_ckpt import TorchAsyncCheckpoint

            ckpt = TorchAsyncCheckpoint()

            def save(step):
                ckpt.async_save(state(step), path)

            def finalize(blocking=False):
                ckpt.finalize_async_save(blocking=blocking, no_dist=True)

            def close():
                ckpt.finalize_async_save(blocking=True, no_dist=True, terminate=True)
        else:
            from nvidia_resiliency_ext.checkpointing.async_ckpt.core import AsyncCallsQueue, AsyncRequest

            queue = AsyncCallsQueue(persistent=True)

            def save(step):
                queue.schedule_async_request(AsyncRequest(torch.save, (state(step), path), []))

            def finalize(blocking=False):
                queue.maybe_finalize_async_calls(blocking=blocking, no_dist=True)

            def close():
                queue.close()  # finalizes what is left, then stops the writer

        def load():
            return torch.load(path, weights_only=False, map_location=device) if os.path.exists(path) else None
    else:
        from nvidia_resiliency_ext.checkpointing.local.ckpt_managers.local_manager import LocalCheckpointManager

        manager = LocalCheckpointManager(args.dir)
        if args.cuda:
            from nvidia_resiliency_ext.checkpointing.local.basic_state_dict import BasicTensorAwareStateDict

        def save(step):
            manager.save((BasicTensorAwareStateDict if args.cuda else CpuStateDict)(state(step)), step)

        def finalize(blocking=False):
            pass

        def load():
            if manager.find_latest() <= 0:
                return None
            sd, _ = manager.load()
            if not args.cuda:
                return sd.to_state_dict()
            sd.restore_tensor_device()
            return sd.state_dict

        def close():
            pass

    start = 0
    loaded = load()
    if loaded is not None:
        model.module.load_state_dict(loaded["model"])
        start = loaded["step"]
    print(f"rank {rank} restart {restart} training from step {start}", flush=True)
    for step in range(start, args.steps):
        if rank == args.crash_rank and step == args.crash_at_step and restart == 0:
            print(f"rank {rank} crashing at step {step}", flush=True)
            os._exit(1)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        finalize()
        if (step + 1) % args.every == 0:
            save(step + 1)
            finalize(blocking=True)  # the checkpoint is there before the next step: the fault below follows it
    close()
    dist.destroy_process_group()
    print(f"rank {rank} restart {restart} done {args.steps} steps", flush=True)
    # Not a test of the teardown: on 2 loaded cores, about 1 launch in 15 left a rank waiting forever as main()
    # returned and its locals (the model, the checkpoint manager) were freed: the main thread in gloo's
    # process-group destructor, gloo's runloop threads waiting too (the destructor that waits for gloo's work
    # queue: pytorch/pytorch#56297). The checkpoints and the goodput are what this script is for, so it ends
    # here, before anything is freed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
