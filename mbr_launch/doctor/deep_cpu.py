"""``--deep`` without a GPU: a real gloo all-reduce across a few local processes.

Each rank is a fresh ``python -m mbr_launch.doctor.deep_cpu --rank R`` subprocess, not multiprocessing: the
parent may be ``python -m mbr_launch``, whose ``__main__`` a spawned child would run again.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from typing import Any

from mbr_launch.doctor.registry import CheckResult

ID = "deep.gloo"
TITLE = "gloo all-reduce across local processes"
ITERS = 10


def run_gloo(*, world: int = 2, timeout_s: float = 60.0, mib: int = 4) -> list[CheckResult]:
    port = free_port()
    start = time.monotonic()
    procs = [subprocess.Popen([sys.executable, "-m", "mbr_launch.doctor.deep_cpu", "--rank", str(r),
                               "--world", str(world), "--port", str(port), "--mib", str(mib),
                               "--timeout", str(timeout_s)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "TORCH_CPP_LOG_LEVEL": "ERROR"})
             for r in range(world)]
    outputs: list[tuple[str, str, int | None]] = []
    timed_out = False
    for proc in procs:
        left = max(0.1, timeout_s - (time.monotonic() - start))
        try:
            out, err = proc.communicate(timeout=left)
        except subprocess.TimeoutExpired:
            timed_out = True
            proc.kill()
            out, err = proc.communicate()
        outputs.append((out, err, proc.returncode))
    for proc in procs:  # one hung rank leaves the others waiting in the collective
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return [_assess(world, mib, outputs, time.monotonic() - start, timed_out, timeout_s)]


def _assess(world: int, mib: int, outputs: list[tuple[str, str, int | None]], total: float, timed_out: bool,
            timeout_s: float) -> CheckResult:
    reports = []
    for rank, (out, err, code) in enumerate(outputs):
        try:
            reports.append(json.loads(out.strip().splitlines()[-1]))
        except (ValueError, IndexError):
            last = (err.strip().splitlines() or ["no output"])[-1][:200]
            reports.append({"rank": rank, "ok": False, "error": f"exit code {code}: {last}"})
    failed = [r for r in reports if not r.get("ok")]
    fix = ("check that localhost TCP works (firewall, `hostname -i`), and that torch.distributed imports; "
           "set GLOO_SOCKET_IFNAME if the default interface is wrong")
    if timed_out:
        return CheckResult(ID, "error", TITLE, f"{world} processes did not finish within {timeout_s:g} s", fix)
    if failed:
        saw = "; ".join(f"rank {r.get('rank')}: {r.get('error', 'wrong sums')}" for r in failed)
        return CheckResult(ID, "error", TITLE, saw, fix)
    each = max(r["ms_per_allreduce"] for r in reports)
    join = max(r["join_s"] for r in reports)
    return CheckResult(ID, "ok", TITLE, f"{world} processes: all-reduce of {mib} MiB correct, {each:.1f} ms each; "
                                        f"group formed in {join:.2f} s, {total:.1f} s in all (no GPU: gloo)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank(rank: int, world: int, port: int, mib: int, timeout_s: float) -> dict[str, Any]:
    import datetime  # noqa: PLC0415

    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415

    began = time.monotonic()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))
    joined = time.monotonic() - began
    try:
        x = torch.full((mib * (1 << 20) // 4,), float(rank + 1), dtype=torch.float32)
        dist.all_reduce(x)  # warm-up, and the correctness probe: small whole numbers sum exactly
        correct = bool((x == float(world * (world + 1) // 2)).all().item())
        t0 = time.monotonic()
        for _ in range(ITERS):
            dist.all_reduce(x)
        per = (time.monotonic() - t0) / ITERS * 1e3
    finally:
        dist.destroy_process_group()
    return {"rank": rank, "ok": correct, "join_s": joined, "ms_per_allreduce": per,
            **({} if correct else {"error": "wrong sums"})}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mbr_launch.doctor.deep_cpu", description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, default=None, help="run one rank (used by the parent)")
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--mib", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args(argv)
    if args.rank is None:
        from mbr_launch.doctor.report import exit_code, to_json  # noqa: PLC0415

        results = run_gloo(world=args.world, timeout_s=args.timeout, mib=args.mib)
        print(to_json(results))
        return exit_code(results)
    try:
        report = _rank(args.rank, args.world, args.port, args.mib, args.timeout)
    except Exception as exc:  # reported to the parent as this rank's failure
        report = {"rank": args.rank, "ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
    print(json.dumps(report), flush=True)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
