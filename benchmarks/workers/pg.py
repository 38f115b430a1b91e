"""The benchmark workers' process-group start: NCCL on cuda:LOCAL_RANK with ``gpu``, else gloo on CPU.

``gpu`` without CUDA exits 2: a benchmark must not silently fall back to another backend."""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist


def init(gpu: bool, who: str) -> torch.device:
    if not gpu:
        dist.init_process_group("gloo")
        return torch.device("cpu")
    if not torch.cuda.is_available():
        print(f"{who}: --gpu given but CUDA is not available", file=sys.stderr, flush=True)
        sys.exit(2)
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    return device
