"""A rank that times its NVRx client's messages to whatever rank monitor its launcher gave it (bench_nvrx07.py).

Run under a launcher with an NVRx ``fault_tolerance`` config that names a ``step`` section (0.6+ clients send
only configured sections) and leaves ``skip_section_response`` at its default (0.6+: True, heartbeats and
sections sent fire-and-forget). For each kind, ``heartbeat`` (``send_heartbeat()``) and ``section``
(``start_section("step")`` + ``end_section("step")``), all ranks together (a gloo barrier before each phase):

- paced: ``--paced`` calls, each timed alone (``perf_counter_ns``), with ``--gap`` seconds of sleep between
  them: the cost a training step pays when the monitor keeps up.
- burst: ``--burst`` calls back to back, timed as a whole: per call once the socket buffers are full, so
  bounded by how fast the monitor reads (fire-and-forget moves the monitor's cost onto the sender only when
  it falls behind); the slowest single call too.

Rank 0 also reads, around each phase, the CPU time (utime + stime, all threads, from /proc) of the launcher
side, per call of all ranks: ``monitor`` (mbr-launch's one rank monitor process; ft_launcher's RankMonitorServer
per rank: the launcher's descendants outside the ranks' subtrees that are not warm standbys) and ``agent`` (the
launcher process itself). Before the phases it waits (``--settle`` s at most) until the launcher side is idle:
mbr-launch starts replacement warm standbys that import torch right after the ranks start, work that has
nothing to do with messages and would land in the first phase.

Writes ``{out_dir}/rank{RANK}.json`` and exits 0; any client error exits 1 (the bench reports it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")
_STANDBY = ("mbr-launch standby", "mbr_launch.shim")  # a warm standby's title, or its command line


def paced(call, n: int, gap: float) -> dict:
    clock = time.perf_counter_ns
    out = []
    for _ in range(n):
        t = clock()
        call()
        out.append((clock() - t) / 1000)
        time.sleep(gap)
    s = sorted(out)
    return {"median_us": statistics.median(s), "p90_us": s[int(len(s) * 0.9)], "p99_us": s[int(len(s) * 0.99)],
            "max_us": s[-1], "n": len(s)}


def burst(call, n: int) -> dict:
    clock = time.perf_counter_ns
    worst = 0
    t0 = clock()
    for _ in range(n):
        t = clock()
        call()
        worst = max(worst, clock() - t)
    return {"per_call_us": (clock() - t0) / 1000 / n, "max_us": worst / 1000, "n": n}


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def launcher_cpu(ranks: set[int]) -> dict[str, float]:
    """CPU seconds used so far on the launcher side: {'agent', 'monitor', 'standby'}."""
    kids: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                kids.setdefault(int(_stat(int(entry.name))[1]), []).append(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    agent = os.getppid()
    out = {"agent": 0.0, "monitor": 0.0, "standby": 0.0}
    todo = [agent]
    while todo:
        pid = todo.pop()
        if pid in ranks:
            continue
        try:
            fields = _stat(pid)
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError):
            continue
        kind = "agent" if pid == agent else "standby" if any(s in cmd for s in _STANDBY) else "monitor"
        out[kind] += (int(fields[11]) + int(fields[12])) / _TICK
        todo += kids.get(pid, [])
    return out


def settle(ranks: set[int], limit: float) -> float:
    """Wait (at most ``limit`` s) until the launcher side used under 5% of a core over half a second."""
    t0 = time.monotonic()
    before = sum(launcher_cpu(ranks).values())
    while time.monotonic() - t0 < limit:
        time.sleep(0.5)
        now = sum(launcher_cpu(ranks).values())
        if now - before < 0.025:
            break
        before = now
    return time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out-dir", type=Path, required=True)
    ap.add_argument("--paced", type=int, default=2000)
    ap.add_argument("--gap", type=float, default=0.001)
    ap.add_argument("--burst", type=int, default=20000)
    ap.add_argument("--warmup", type=int, default=300)
    ap.add_argument("--settle", type=float, default=20.0)
    args = ap.parse_args()

    from importlib.metadata import version

    import torch.distributed as dist
    from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

    dist.init_process_group("gloo")
    client = RankMonitorClient()
    client.init_workload_monitoring()

    def section() -> None:
        client.start_section("step")
        client.end_section("step")

    world, rank0 = dist.get_world_size(), dist.get_rank() == 0
    pids: list[int] = [0] * world
    dist.all_gather_object(pids, os.getpid())
    ranks = set(pids)
    result: dict = {"rank": dist.get_rank(), "nvrx": version("nvidia-resiliency-ext"),
                    "skip_section_response": getattr(client.cfg, "skip_section_response", None)}
    if rank0:
        result["settled_s"] = settle(ranks, args.settle)
    for kind, call in {"heartbeat": client.send_heartbeat, "section": section}.items():
        dist.barrier()
        for _ in range(args.warmup):
            call()
        for phase, n in (("paced", args.paced), ("burst", args.burst)):
            dist.barrier()
            cpu = launcher_cpu(ranks) if rank0 else {}
            result[f"{kind}_{phase}"] = paced(call, n, args.gap) if phase == "paced" else burst(call, n)
            dist.barrier()  # every rank's calls made (a monitor that lags may not have read them all)
            if rank0:
                after = launcher_cpu(ranks)
                for part in ("agent", "monitor"):
                    result[f"{kind}_{phase}"][f"{part}_cpu_us"] = (after[part] - cpu[part]) * 1e6 / (n * world)
    dist.barrier()
    client.shutdown_workload_monitoring()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / f"rank{os.environ['RANK']}.json").write_text(json.dumps(result))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
