"""``--deep``: a short GEMM and NCCL all-reduce test on every local GPU, to find a bad GPU or link before
training does. One spawned process per GPU (the parent never touches CUDA); a GPU or pair well below the
median is a warning, a failure, a hang or a wrong sum an error. Without CUDA: ``deep_cpu``.
"""

from __future__ import annotations

import argparse
import queue
import statistics
import sys
import time
from typing import Any

from mbr_launch.doctor.deep_cpu import free_port, run_gloo
from mbr_launch.doctor.registry import CheckResult, Severity

ID = "deep.gpu"
TITLE = "GPU GEMM and NCCL all-reduce self-test"
GEMM_SLOW, PAIR_SLOW = 0.8, 0.5  # fraction of the median below which a GPU / pair is flagged


def run_deep(*, timeout_s: float = 90.0, gemm_n: int = 8192, allreduce_mib: int = 256) -> list[CheckResult]:
    try:
        import torch  # noqa: PLC0415
    except ImportError as exc:
        return [CheckResult(ID, "skip", TITLE, f"no GPU (torch not importable: {exc})", "")]
    if not torch.cuda.is_available():
        return run_gloo(timeout_s=timeout_s)
    world = torch.cuda.device_count()
    msgs, failures = _run_workers(world, timeout_s, gemm_n, allreduce_mib)
    return _assess(world, msgs, failures)


def _run_workers(world: int, timeout_s: float, gemm_n: int, mib: int) -> tuple[list[tuple], list[str]]:
    import torch.multiprocessing as mp  # noqa: PLC0415

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, world, port, q, gemm_n, mib), daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout_s
    msgs: list[tuple] = []
    done: set[int] = set()
    failures: list[str] = []
    while len(done) < world:
        left = deadline - time.monotonic()
        if left <= 0:
            failures.append(f"timed out after {timeout_s:g}s; GPUs that did not finish: "
                            f"{sorted(set(range(world)) - done)}")
            break
        try:
            msg = q.get(timeout=min(left, 1.0))
        except queue.Empty:
            dead = [r for r, p in enumerate(procs) if r not in done and p.exitcode is not None]
            if dead:
                failures.append(f"worker for GPU{dead[0]} exited with code {procs[dead[0]].exitcode}")
                break
            continue
        if msg[0] in ("done", "fail"):
            done.add(msg[1])
        if msg[0] == "fail":
            failures.append(f"GPU{msg[1]}: {msg[2]}")
        msgs.append(msg)
    for p in procs:
        p.join(timeout=5 if not failures else 0.5)
        if p.is_alive():
            p.kill()  # a hung NCCL call ignores SIGTERM
            p.join(timeout=5)
    return msgs, failures


def _worker(rank: int, world: int, port: int, q: Any, n: int, mib: int) -> None:
    import datetime  # noqa: PLC0415

    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415

    try:
        torch.cuda.set_device(rank)
        dev = torch.device("cuda", rank)
        q.put(("gemm", rank, _gemm_tflops(torch, dev, n)))
        if world < 2:
            q.put(("done", rank, None))
            return
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=60), device_id=dev)
        x = torch.empty(mib * (1 << 20) // 2, dtype=torch.bfloat16, device=dev)
        groups = [[i, j] for i in range(world) for j in range(i + 1, world)]
        if world > 2:
            groups.append(list(range(world)))
        for ranks in groups:
            g = dist.new_group(ranks)  # collective over the default group: every rank calls it
            if rank in ranks:
                gbps, correct = _allreduce(torch, dist, x, g, ranks, rank)
                if rank == ranks[0]:
                    q.put(("allreduce", tuple(ranks), (gbps, correct)))
            dist.barrier()
        dist.destroy_process_group()
        q.put(("done", rank, None))
    except Exception as exc:  # report, then exit: the parent turns it into an error result
        q.put(("fail", rank, f"{type(exc).__name__}: {exc}"))


def _gemm_tflops(torch: Any, dev: Any, n: int, iters: int = 20) -> float:
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize(dev)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        a @ b
    end.record()
    end.synchronize()
    return 2 * n**3 * iters / (start.elapsed_time(end) / 1e3) / 1e12


def _allreduce(torch: Any, dist: Any, x: Any, group: Any, ranks: list[int], rank: int, iters: int = 10) -> tuple[float, bool]:
    for _ in range(3):
        dist.all_reduce(x, group=group)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        dist.all_reduce(x, group=group)
    end.record()
    end.synchronize()
    secs = start.elapsed_time(end) / 1e3 / iters
    k = len(ranks)
    busbw = x.numel() * x.element_size() * 2 * (k - 1) / k / secs / 1e9  # NCCL-tests' bus bandwidth
    # Values small enough to be exact in float32: a wrong sum means a broken link or GPU.
    probe = torch.full((1 << 20,), float(rank + 1), dtype=torch.float32, device=x.device)
    dist.all_reduce(probe, group=group)
    correct = bool((probe == float(sum(r + 1 for r in ranks))).all().item())
    return busbw, correct


def _assess(world: int, msgs: list[tuple], failures: list[str]) -> list[CheckResult]:
    gemm = {m[1]: m[2] for m in msgs if m[0] == "gemm"}
    pairs = {m[1]: m[2] for m in msgs if m[0] == "allreduce"}
    out = []
    if gemm:
        med = statistics.median(gemm.values())
        saw = ", ".join(f"GPU{r}: {t:.0f} TFLOP/s" for r, t in sorted(gemm.items()))
        slow = [r for r, t in gemm.items() if t < GEMM_SLOW * med]
        sev = "warn" if slow else "ok"
        fix = f"GPU(s) {slow} are below {GEMM_SLOW:.0%} of the median: check clocks/thermals (nvidia-smi -q -d PERFORMANCE)" if slow else ""
        out.append(CheckResult(ID + ".gemm", sev, "bf16 GEMM per GPU", saw, fix))
    def allreduce(severity: Severity, saw: str, fix: str = "") -> CheckResult:
        return CheckResult(ID + ".allreduce", severity, "NCCL all-reduce per GPU pair", saw, fix)

    if pairs:
        med = statistics.median(bw for bw, _ in pairs.values())
        saw = ", ".join(f"GPU{'+'.join(map(str, k)) if len(k) <= 2 else 'all'}: {bw:.0f} GB/s"
                        for k, (bw, _) in sorted(pairs.items(), key=lambda kv: (len(kv[0]), kv[0])))
        wrong = [k for k, (_, ok) in pairs.items() if not ok]
        slow = [k for k, (bw, _) in pairs.items() if len(k) == 2 and bw < PAIR_SLOW * med]
        if wrong:
            out.append(allreduce("error", saw + f"; wrong sums on {wrong}",
                                 "drain the node: a GPU or NVLink returns corrupted data"))
        elif slow:
            out.append(allreduce("warn", saw, f"pairs {slow} are below {PAIR_SLOW:.0%} of the median: check "
                                              "`nvidia-smi topo -m` and NVLink errors"))
        else:
            out.append(allreduce("ok", saw))
    elif world < 2 and not failures:
        out.append(allreduce("skip", "one GPU: no pair to test"))
    if failures:
        out.append(CheckResult(ID, "error", TITLE, "; ".join(failures),
                               "rerun with NCCL_DEBUG=WARN to see which GPU or link fails; drain the node if it repeats"))
    return out


def main(argv: list[str] | None = None) -> int:
    from mbr_launch.doctor.report import exit_code, to_json  # noqa: PLC0415

    parser = argparse.ArgumentParser(prog="python -m mbr_launch.doctor.deep", description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=90.0, help="seconds before hung workers are killed")
    parser.add_argument("--gemm-n", type=int, default=8192)
    parser.add_argument("--allreduce-mib", type=int, default=256)
    args = parser.parse_args(argv)
    results = run_deep(timeout_s=args.timeout, gemm_n=args.gemm_n, allreduce_mib=args.allreduce_mib)
    print(to_json(results))
    return exit_code(results)


if __name__ == "__main__":
    # Call through the imported module, so spawned workers unpickle mbr_launch.doctor.deep._worker.
    from mbr_launch.doctor import deep as _deep

    sys.exit(_deep.main())
