"""Client round-trip latency: mbr-launch's monitor vs NVRx 0.4.1's own RankMonitorServer.

Both servers run as separate processes at the same time; one process holds a real NVRx
``RankMonitorClient`` for each and interleaves rounds between them, so machine noise hits both alike.
Measured per call with ``perf_counter_ns``: ``send_heartbeat()``, and ``start_section`` + ``end_section``.

    python benchmarks/bench_monitor_rpc.py [--rounds 20] [--per-round 500]

Prints a Markdown table (medians and p90 in microseconds, ratio NVRx / ours, and the same for the
quietest round, which is what to compare on a shared machine).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def start_ours(directory: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "mbr_launch.monitor.server"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO,
    )
    cfg = {"initial_rank_heartbeat_timeout": 600.0, "rank_heartbeat_timeout": 600.0,
           "rank_section_timeouts": {"step": 600.0}, "rank_out_of_section_timeout": 600.0,
           "enable_nic_monitor": False}
    sock = os.path.join(directory, "rmon0.sock")
    assert proc.stdin and proc.stdout
    for msg in ({"op": "configure", "dir": directory, "cfg": cfg},
                {"op": "arm", "local_rank": 0, "rank": 0, "pid": os.getpid(), "pgid": None, "socket": sock}):
        proc.stdin.write(json.dumps(msg) + "\n")
        proc.stdin.flush()
        json.loads(proc.stdout.readline())
    return proc, sock


def start_nvrx(directory: str):
    import multiprocessing

    from nvidia_resiliency_ext.fault_tolerance import FaultToleranceConfig, RankMonitorServer

    cfg = FaultToleranceConfig(initial_rank_heartbeat_timeout=600.0, rank_heartbeat_timeout=600.0,
                               rank_section_timeouts={"step": 600.0}, rank_out_of_section_timeout=600.0,
                               enable_nic_monitor=False, log_level="ERROR")
    sock = os.path.join(directory, "nvrx0.sock")
    proc = RankMonitorServer.run_in_subprocess(cfg=cfg, ipc_socket_path=sock, is_restarter_logger=False,
                                               mp_ctx=multiprocessing.get_context("fork"))
    return proc, sock


def client_for(sock: str, directory: str):
    from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

    os.environ["FT_RANK_MONITOR_IPC_SOCKET"] = sock
    os.environ["FT_LAUNCHER_IPC_SOCKET"] = os.path.join(directory, "launcher.sock")
    client = RankMonitorClient()
    client.init_workload_monitoring()
    return client


def sample(client, what: str, n: int) -> list[float]:
    clock = time.perf_counter_ns
    out = []
    if what == "heartbeat":
        for _ in range(n):
            t = clock()
            client.send_heartbeat()
            out.append((clock() - t) / 1000)
    else:
        for _ in range(n):
            t = clock()
            client.start_section("step")
            client.end_section("step")
            out.append((clock() - t) / 1000)
    return out


def versions() -> str:
    from importlib.metadata import version

    return f"Python {platform.python_version()}, torch {version('torch')}, nvidia-resiliency-ext {version('nvidia-resiliency-ext')}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--per-round", type=int, default=500)
    args = ap.parse_args()
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    with tempfile.TemporaryDirectory(prefix="mbr-bench-") as directory:
        os.chmod(directory, 0o700)
        ours, our_sock = start_ours(directory)
        nvrx, nvrx_sock = start_nvrx(directory)
        try:
            clients = {"mbr-launch": client_for(our_sock, directory), "NVRx 0.4.1": client_for(nvrx_sock, directory)}
            results: dict[tuple[str, str], list[float]] = {}
            rounds: dict[tuple[str, str], list[float]] = {}  # per-round medians
            for what in ("heartbeat", "section"):
                for c in clients.values():
                    sample(c, what, 200)  # warm-up: caches, first-use paths
                for _ in range(args.rounds):
                    for name, c in clients.items():
                        xs = sample(c, what, args.per_round)
                        results.setdefault((name, what), []).extend(xs)
                        rounds.setdefault((name, what), []).append(statistics.median(xs))
            for c in clients.values():
                c.shutdown_workload_monitoring()
        finally:
            ours.stdin.write('{"op":"exit"}\n')
            ours.stdin.close()
            ours.wait(10)
            nvrx.terminate()
            nvrx.join(10)

    def stat(name: str, what: str) -> tuple[float, float, float]:
        xs = sorted(results[(name, what)])
        # The quietest round's median: robust to other load on a shared machine.
        return statistics.median(xs), xs[int(len(xs) * 0.9)], min(rounds[(name, what)])

    n = args.rounds * args.per_round
    print(f"Date: {datetime.datetime.now().isoformat(timespec='seconds')}  ")
    print(f"Machine: `{' '.join(platform.uname())}`, nproc {os.cpu_count()}  ")
    print(f"Versions: {versions()}  ")
    print(f"Samples: {n} per cell, {args.rounds} interleaved rounds of {args.per_round}\n")
    print("| call | mbr-launch median (p90) us | NVRx 0.4.1 median (p90) us | NVRx / ours | "
          "quietest round: ours / NVRx us | ratio |")
    print("|---|---|---|---|---|---|")
    for what, label in (("heartbeat", "send_heartbeat()"), ("section", "start_section + end_section")):
        om, o90, ob = stat("mbr-launch", what)
        nm, n90, nb = stat("NVRx 0.4.1", what)
        print(f"| {label} | {om:.1f} ({o90:.1f}) | {nm:.1f} ({n90:.1f}) | {nm / om:.2f}x | "
              f"{ob:.1f} / {nb:.1f} | {nb / ob:.2f}x |")


if __name__ == "__main__":
    main()
