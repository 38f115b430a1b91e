"""Between a round's stop and the next start: wait until this node's GPUs have their memory back.

ft_launcher 0.6/0.7 (``--ft-gpu-memory-reclaim-timeout``, ``-tolerance-mb``, ``-poll-interval``; NVRx's
defaults 50 s, 512 MB, 2 s) polls NVML after stopping the workers, until the memory used on each GPU is at
most the tolerance or the timeout passes; then it warns and goes on (best effort). A GPU that cannot be read
does not hold the wait. Here the same, with two differences: the GPUs are those the workers see (the first
``--nproc-per-node`` of ``CUDA_VISIBLE_DEVICES``, by index or UUID; indices 0..N-1 when it is unset, as NVRx),
and a signal ends the wait at once.

``wait_reclaimed`` is pure: the NVML reader, the clock and the sleep come in.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

MB = 1024 * 1024


@dataclass(frozen=True)
class Sample:
    device: str  # an index or a UUID, as CUDA_VISIBLE_DEVICES names it
    used_mb: float | None  # None: this GPU could not be read (it does not hold the wait)


@dataclass(frozen=True)
class Reclaim:
    reclaimed: bool
    seconds: float
    polls: int
    last: tuple[Sample, ...]  # the last poll's samples
    interrupted: bool = False  # a signal ended the wait

    def over(self, tolerance_mb: float) -> list[Sample]:
        return [s for s in self.last if s.used_mb is not None and s.used_mb > tolerance_mb]


def wait_reclaimed(read: Callable[[], Sequence[Sample]], *, timeout: float, tolerance_mb: float,
                   poll_interval: float, clock: Callable[[], float], sleep: Callable[[float], bool]) -> Reclaim:
    """Poll ``read`` until every readable GPU uses at most ``tolerance_mb``, or ``timeout`` seconds passed
    (the last poll falls on the deadline). ``sleep`` returns False when a signal cut it short."""
    start = clock()
    deadline = start + timeout
    polls = 0
    while True:
        samples = tuple(read())
        polls += 1
        if all(s.used_mb is None or s.used_mb <= tolerance_mb for s in samples):
            return Reclaim(True, clock() - start, polls, samples)
        left = deadline - clock()
        if left <= 0:
            return Reclaim(False, clock() - start, polls, samples)
        if not sleep(min(poll_interval, left)):
            return Reclaim(False, clock() - start, polls, samples, interrupted=True)


def devices(environ: Mapping[str, str], nproc_per_node: int) -> list[str]:
    """The GPUs this node's workers use: the first ``nproc_per_node`` of CUDA_VISIBLE_DEVICES (indices or
    GPU-/MIG- UUIDs), or 0..N-1 when it is unset. Set but empty (or -1...): none."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return [str(i) for i in range(nproc_per_node)]
    chosen: list[str] = []
    for item in (v.strip() for v in visible.split(",")):
        if not item or item.startswith("-"):
            break  # CUDA stops at the first invalid entry
        chosen.append(item)
    return chosen[:nproc_per_node]


def describe(samples: Sequence[Sample]) -> str:
    return ", ".join(f"GPU {s.device} {'?' if s.used_mb is None else f'{s.used_mb:.0f} MB'}" for s in samples)


class NvmlReader:
    """Used memory of the chosen GPUs through NVML (nvidia-ml-py), opened for one wait: ``open`` says why
    there is no reader (no nvidia-ml-py, no driver)."""

    def __init__(self, nvml: Any, devices: Sequence[str]) -> None:
        self._nv = nvml
        self._devices = list(devices)

    @classmethod
    def open(cls, devices: Sequence[str]) -> "NvmlReader | str":
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the deprecated "pynvml" shim NVRx pulls in warns on import
                import pynvml  # noqa: PLC0415 - optional: only where the wait is asked for
        except ImportError:
            return "nvidia-ml-py is not installed"
        try:
            pynvml.nvmlInit()
        except Exception as err:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...: no GPU driver here
            return f"NVML is not available ({err})"
        return cls(pynvml, devices)

    def __call__(self) -> list[Sample]:
        return [Sample(d, self._used(d)) for d in self._devices]

    def _used(self, device: str) -> float | None:
        nv = self._nv
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(int(device)) if device.isdigit() \
                else nv.nvmlDeviceGetHandleByUUID(device)
            v2 = getattr(nv, "nvmlMemory_v2", None)  # v2: memory the driver reserves is not "used"
            info = nv.nvmlDeviceGetMemoryInfo(handle, version=v2) if v2 is not None \
                else nv.nvmlDeviceGetMemoryInfo(handle)
            return float(info.used) / MB
        except Exception:
            return None

    def close(self) -> None:
        try:
            self._nv.nvmlShutdown()
        except Exception:
            pass
