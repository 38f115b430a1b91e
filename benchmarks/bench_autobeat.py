"""Per-step cost of the automatic step heartbeat (``mbr_launch.shim.autobeat``) on a ~10 ms optimizer step.

One process, no launcher: a small MLP's forward, backward and ``optimizer.step()`` with the batch size
calibrated so one step takes about 10 ms. Blocks of steps run alternately with and without the hook
(registered/removed between blocks, beats going to a real datagram socket read by another process, as the
rank monitor does), so load changes hit both alike. Reported: median per-step time of each, the
difference and ratio of medians, and the hook's own cost timed directly (the hook called in a tight loop).

    python benchmarks/bench_autobeat.py --blocks 40 --steps 50 --out benchmarks/RESULTS.md
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from harness import machine_lines, write_section  # noqa: E402

DRAIN = """
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
n = 0
while s.recv(64) != b"stop":
    n += 1
print(n)
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=40, help="blocks per variant (alternating)")
    ap.add_argument("--steps", type=int, default=50, help="steps per block")
    ap.add_argument("--target-ms", type=float, default=10.0)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    directory = tempfile.mkdtemp(prefix="mbr-bench-")
    path = os.path.join(directory, "steps0.sock")
    # The receiver is another process, as the rank monitor is (a thread would compete for our GIL).
    drain = subprocess.Popen([sys.executable, "-c", DRAIN, path], stdout=subprocess.PIPE, text=True)
    while not os.path.exists(path):
        time.sleep(0.01)

    from mbr_launch.shim import autobeat

    assert autobeat.install(path)
    import torch

    assert autobeat.installed()
    torch.set_num_threads(1)
    beater = autobeat._state
    assert beater is not None
    beater.handle.remove()  # we toggle it per block below
    from torch.optim.optimizer import register_optimizer_step_post_hook as register

    hidden = 256
    model = torch.nn.Sequential(torch.nn.Linear(hidden, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    batch = 64
    while True:  # calibrate the batch to ~target ms
        x, y = torch.randn(batch, hidden), torch.randint(0, 10, (batch,))
        for _ in range(5):
            step(x, y)
        t0 = time.perf_counter()
        for _ in range(10):
            step(x, y)
        per = (time.perf_counter() - t0) / 10 * 1e3
        if per >= args.target_ms * 0.9 or batch > 1 << 16:
            break
        batch = int(batch * max(1.1, args.target_ms / per))

    times: dict[str, list[float]] = {"off": [], "on": []}
    for block in range(args.blocks * 2):
        variant = ("off", "on")[(block + block // 2) % 2]  # ABBA order
        handle = register(beater) if variant == "on" else None
        for _ in range(args.steps):
            t0 = time.perf_counter()
            step(x, y)
            times[variant].append(time.perf_counter() - t0)
        if handle is not None:
            handle.remove()

    # the hook alone: what it adds to each step, without the step's noise
    handle = register(beater)
    n = 20000
    t0 = time.perf_counter()
    for _ in range(n):
        beater(opt, (), {})
    hook_us = (time.perf_counter() - t0) / n * 1e6
    handle.remove()
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as control:
        control.sendto(b"stop", path)
    received = int(drain.communicate(timeout=30)[0].strip() or 0)
    os.unlink(path)
    os.rmdir(directory)

    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    q = {k: statistics.quantiles(v, n=4) for k, v in times.items()}
    diff = med["on"] - med["off"]
    lines = [
        "## Automatic step heartbeat: per-step cost (`bench_autobeat.py`)",
        "",
        f"`{' '.join(['python', 'benchmarks/bench_autobeat.py', *sys.argv[1:]])}`",
        "",
        *machine_lines(gpu=False, mbr_code="working tree"),
        "",
        f"One process, MLP {hidden}-{hidden}-10, batch {batch} (calibrated to ~{args.target_ms:g} ms), "
        f"torch threads 1; {args.blocks} blocks of {args.steps} steps per variant, ABBA-interleaved; beats sent "
        f"to a real AF_UNIX datagram socket ({received} received by another process).",
        "",
        "| variant | median step | p25 | p75 | steps |",
        "|---|---|---|---|---|",
        *(f"| hook {k} | {med[k]:.3f} ms | {q[k][0] * 1e3:.3f} ms | {q[k][2] * 1e3:.3f} ms | {len(times[k])} |"
          for k in ("off", "on")),
        "",
        f"- difference of medians: {diff * 1e3:+.1f} us per step, ratio on/off {med['on'] / med['off']:.3f} "
        f"(smaller than the p25-p75 spread of "
        f"{(q['off'][2] - q['off'][0]) * 1e3:.2f} ms: on a loaded machine the per-call timing below is the "
        "reliable figure)" if abs(diff) < (q['off'][2] - q['off'][0]) * 1e3 else
        f"- difference of medians: {diff * 1e3:+.1f} us per step, ratio on/off {med['on'] / med['off']:.3f}",
        f"- load average at the end: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs",
        f"- the hook alone, called {n} times in a loop: {hook_us:.2f} us per call = "
        f"{hook_us / 1e3 / med['off'] * 100:.3f}% of a {med['off']:.1f} ms step (target: under 1%)",
    ]
    body = "\n".join(lines)
    print(body)
    if args.out:
        write_section(args.out, "bench_autobeat", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
