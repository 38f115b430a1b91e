"""Between a round's stop and the next start: wait until this node's GPUs have this job's memory back.

Only the stopped round's own processes are waited for, not ft_launcher's total under a tolerance, which a
stranger keeps up for the whole timeout (docs/node-checks.md). Pure: the reading, clock and sleep come in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from mbr_launch.health.gpuowners import Holder, Owner, Reading
from mbr_launch.health.nvml import GpuMemory

FIRST_POLL = 0.05  # seconds before the second poll; each pause doubles up to the poll interval


@dataclass(frozen=True)
class Reclaim:
    reclaimed: bool
    seconds: float
    polls: int
    last: Reading  # the last poll's
    tolerance_mb: float
    interrupted: bool = False  # a signal ended the wait

    def holding(self) -> list[Holder]:
        return self.last.of(Owner.ENDED)

    def over(self) -> list[GpuMemory]:
        return [m for m in self.last.memories if not _settled(m, self.last, self.tolerance_mb)
                and m.processes is None]


def _settled(memory: GpuMemory, reading: Reading, tolerance_mb: float) -> bool:
    if memory.used_mb is None:
        return True  # cannot be read: does not hold the wait (NVRx's rule)
    if memory.processes is None:
        return memory.used_mb <= tolerance_mb
    return not any(h.device == memory.device for h in reading.of(Owner.ENDED))


def wait_reclaimed(read: Callable[[], Reading], *, timeout: float, tolerance_mb: float, poll_interval: float,
                   clock: Callable[[], float], sleep: Callable[[float], bool]) -> Reclaim:
    """Poll ``read`` until every GPU is settled or ``timeout`` passed; ``sleep`` returns False on a signal."""
    start = clock()
    deadline = start + timeout
    polls = 0
    pause = min(FIRST_POLL, poll_interval)
    while True:
        reading = read()
        polls += 1
        if all(_settled(m, reading, tolerance_mb) for m in reading.memories):
            return Reclaim(True, clock() - start, polls, reading, tolerance_mb)
        left = deadline - clock()
        if left <= 0:
            return Reclaim(False, clock() - start, polls, reading, tolerance_mb)
        if not sleep(min(pause, left)):
            return Reclaim(False, clock() - start, polls, reading, tolerance_mb, interrupted=True)
        pause = min(pause * 2, poll_interval)


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


def describe(memories: Sequence[GpuMemory]) -> str:
    return ", ".join(f"GPU {m.device} {'?' if m.used_mb is None else f'{m.used_mb:.0f} MB'}" for m in memories)


def held_by_job(reading: Reading, pids: Sequence[int]) -> dict[str, float]:
    """MB that ``pids`` (the job's workers) hold on each GPU, where NVML says."""
    wanted = set(pids)
    held: dict[str, float] = {}
    for memory in reading.memories:
        for process in memory.processes or ():
            if process.pid in wanted and process.used_mb is not None:
                held[memory.device] = held.get(memory.device, 0.0) + process.used_mb
    return held


def short_of(reading: Reading, needed: Mapping[str, float]) -> list[tuple[GpuMemory, float, float]]:
    """(GPU, free MB, needed MB) where strangers leave less free than the job's workers used there last round
    (``needed``; a GPU not in it: the most any GPU needed)."""
    if not needed:
        return []
    most = max(needed.values())
    short = []
    for memory in reading.memories:
        on_it = [h for h in reading.holders if h.device == memory.device]
        if memory.free_mb is None or not any(h.owner is Owner.STRANGER for h in on_it):
            continue
        free = memory.free_mb + sum(h.used_mb or 0.0 for h in on_it if h.owner is Owner.ENDED)
        need = needed.get(memory.device, most)
        if free < need:
            short.append((memory, free, need))
    return short
