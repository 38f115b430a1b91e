"""Between a round's stop and the next start, as pure logic: the GPUs the reclaim wait looks at, what counts
as a leftover of the stopped round (a scripted process table), and the workers' NUMA binding from
NVRX_GPUS_PER_NUMA. One test reads real GPUs through NVML and skips where there are none."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from mbr_launch.health import gpumem, gpuowners, leftovers
from mbr_launch.health.gpuowners import Job, Owner, Reading
from mbr_launch.health.nvml import Nvml
from mbr_launch.workers import numa, strays
from mbr_launch.workers.strays import Proc
from testkit.clocks import Clock

pytestmark = pytest.mark.timeout(30)


# ---- GPU memory reclaim ------------------------------------------------------------------------------------

# The wait's rule, with NVML faked at its boundary: tests/test_gpu_memory.py.


def test_the_gpus_are_the_workers():
    assert gpumem.devices({}, 4) == ["0", "1", "2", "3"]  # NVRx: indices 0..N-1
    assert gpumem.devices({"CUDA_VISIBLE_DEVICES": "4,5, 6,7"}, 2) == ["4", "5"]
    assert gpumem.devices({"CUDA_VISIBLE_DEVICES": "GPU-aa,MIG-bb"}, 8) == ["GPU-aa", "MIG-bb"]
    assert gpumem.devices({"CUDA_VISIBLE_DEVICES": ""}, 2) == []
    assert gpumem.devices({"CUDA_VISIBLE_DEVICES": "1,-1,2"}, 4) == ["1"]  # CUDA stops at an invalid entry


# A process that holds 2 GiB on CUDA device 0 through the driver API (no torch needed), until killed.
HOLD_GPU_MEMORY = """
import ctypes, time
cuda = ctypes.CDLL("libcuda.so.1")
dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
assert cuda.cuInit(0) == 0 and cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev) == 0
assert cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(2 << 30)) == 0
print("holding", flush=True)
time.sleep(120)
"""


@pytest.mark.processes
def test_real_gpu_memory_is_waited_for_until_a_killed_process_gives_it_back():
    session = Nvml.open()
    if isinstance(session, str):
        pytest.skip(f"no NVML here: {session}")
    holder = None
    try:
        holder = subprocess.Popen([sys.executable, "-c", HOLD_GPU_MEMORY], stdout=subprocess.PIPE, text=True,
                                  env={**os.environ, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
        assert holder.stdout.readline().strip() == "holding"
        job = Job(me=os.getpid(), ended=frozenset({holder.pid}))

        def read() -> Reading:
            return gpuowners.classify([session.memory("0")], job, strays.process_table(), gpuowners.seen)

        held = read()
        assert [h.pid for h in held.of(Owner.ENDED)] == [holder.pid], held  # NVML names it by this pid
        clock = Clock()
        got = gpumem.wait_reclaimed(read, timeout=3, tolerance_mb=512, poll_interval=1, clock=clock, sleep=clock.sleep)
        assert not got.reclaimed and [h.pid for h in got.holding()] == [holder.pid]
        holder.kill()  # its memory comes back once the driver has torn its context down
        got = gpumem.wait_reclaimed(read, timeout=30, tolerance_mb=512, poll_interval=0.2,
                                    clock=time.monotonic, sleep=lambda s: time.sleep(s) is None)
        assert got.reclaimed, got
    finally:
        if holder is not None:
            holder.kill()
            holder.wait()
        session.close()


# ---- leftovers ---------------------------------------------------------------------------------------------

ME = 100
MARKS = leftovers.markers("job", 29600, 1)


def _table(**procs: tuple[int, int] | tuple[int, int, bool]) -> dict[int, Proc]:
    out = {}
    for name, spec in procs.items():
        ppid, pgid, *zombie = spec
        out[int(name[1:])] = Proc(ppid=ppid, pgid=pgid, zombie=bool(zombie and zombie[0]))
    return out


def test_what_survived_a_stop():
    table = _table(p100=(1, 100), p200=(100, 200),  # the agent, its rank monitor (kept)
                   p300=(100, 300),  # a standby (kept)
                   p401=(1, 400),  # still in stopped worker 400's group (stuck past SIGKILL)
                   p402=(100, 402),  # an orphan of a worker's tree, adopted by the agent, its environment cleared
                   p403=(402, 402),  # ... and its child
                   p404=(1, 404),  # escaped elsewhere, still carrying the round's environment
                   p405=(1, 405),  # another agent's worker on this host: another group rank
                   p406=(100, 406, True))  # a zombie of ours: the stop's sweep reaps it
    env = {404: [b"PATH=/bin", *MARKS], 405: [m.replace(b"GROUP_RANK=1", b"GROUP_RANK=0") for m in MARKS]}
    found = leftovers.find(table, me=ME, workers=[400], keep={200, 300}, environ_of=lambda pid: env.get(pid, []),
                           marks=MARKS)
    assert [(f.pid, f.why) for f in found] == [
        (401, "in the process group of stopped worker 400"),
        (402, "an orphan of a worker's processes, adopted by the launcher"),
        (403, "a descendant of 402"),
        (404, "carries this round's worker environment")]
    named = leftovers.with_cmdlines(found, read=lambda pid: f"sleep {pid}")
    text = leftovers.line(named, 0)
    assert text.startswith("WARNING: 4 processes of round 0 still alive after its workers were stopped: ")
    assert "pid 402 `sleep 402` (an orphan of a worker's processes, adopted by the launcher)" in text
    assert named[0].to_event() == {"pid": 401, "ppid": 1, "pgid": 400, "why": found[0].why, "cmdline": "sleep 401"}


def test_nothing_left_nothing_found_and_the_line_is_bounded():
    assert leftovers.find(_table(p100=(1, 100), p200=(100, 200)), me=ME, workers=[400], keep={200},
                          environ_of=lambda pid: [], marks=MARKS) == []
    many = [leftovers.Leftover(pid, 1, 400, "why", "cmd") for pid in range(1000, 1030)]
    assert leftovers.line(many, 2).endswith("; and 10 more (--ft-check-remaining-processes; left running)")


# ---- NUMA binding ------------------------------------------------------------------------------------------

def test_numa_binding_as_nvrx_computes_it():
    got = numa.plan("2", nproc_per_node=4, strict=True, numactl="/usr/bin/numactl", nodes={0, 1})
    assert got.wrap(3, ["python", "train.py"]) == ["/usr/bin/numactl", "--cpunodebind=1", "--membind=1", "python",
                                                    "train.py"]
    assert got.wrap(1, ["x"])[:3] == ["/usr/bin/numactl", "--cpunodebind=0", "--membind=0"]
    assert got.line == ("NUMA binding (NVRX_GPUS_PER_NUMA=2, numactl --cpunodebind --membind): local ranks 0-1 on "
                        "node 0, 2-3 on node 1")
    loose = numa.plan("4", nproc_per_node=1, strict=False, numactl="numactl", nodes={0})
    assert loose.wrap(0, ["x"]) == ["numactl", "--cpunodebind=0", "--localalloc", "x"]


def test_what_numa_binding_cannot_do_is_said_and_nothing_is_bound():
    unset = numa.plan(None, nproc_per_node=2, strict=True, numactl="numactl", nodes={0})
    assert unset.line is None and unset.wrap(1, ["x"]) == ["x"]
    for value, numactl, nodes, why in (("two", "numactl", {0}, "not a positive whole number"),
                                       ("0", "numactl", {0}, "not a positive whole number"),
                                       ("1", None, {0}, "numactl is not installed"),
                                       ("1", "numactl", {0}, "need NUMA node(s) 1, which this host does not have")):
        got = numa.plan(value, nproc_per_node=2, strict=True, numactl=numactl, nodes=nodes)
        assert got.prefixes == {} and why in (got.line or ""), (value, got.line)
        assert got.line.startswith("WARNING: NVRX_GPUS_PER_NUMA=") and got.line.endswith("workers are not NUMA-bound")
    assert numa.parse_nodes("0-2,4\n") == {0, 1, 2, 4} and numa.parse_nodes("0") == {0}
