"""Worker output throughput: how long a worker takes to write 20 MB in 200k lines through mbr-launch.

The worker times its own writes (from the first line to the final flush; it writes blocks of 10k lines, so
its own share is ~10 ms): a launcher that drains its pipes slowly makes the worker wait in ``write``, so the
time is the launcher's cost. Run directly (its stdout a
pipe the bench drains), under mbr-launch with output to the console, and with ``--tee 3`` (console and log
files); the launcher's own output is a pipe the bench drains too (not a terminal). ``--baseline REV`` runs
the same under the mbr_launch of a git revision (a ``git archive`` snapshot), for before/after numbers.

    python benchmarks/bench_output.py --trials 3 --baseline main --out benchmarks/RESULTS.md
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from harness import machine_lines, write_section  # noqa: E402
from harness.launchers import snapshot  # noqa: E402
from testkit.helpers import launcher_env  # noqa: E402

# Lines prepared in blocks of 10k and written at once: the worker itself takes ~10 ms, the rest is the wait
# for the launcher to drain the pipe.
WORKER = """
import os, sys, time
block = (b"x" * 99 + b"\\n") * 10_000
t0 = time.perf_counter()
for _ in range({lines} // 10_000):
    sys.stdout.buffer.write(block)
sys.stdout.flush()
elapsed = time.perf_counter() - t0
if os.environ.get("RANK", "0") == "0":
    with open(sys.argv[1], "w") as f:
        f.write(str(elapsed))
"""


def _run(argv: list[str], env: dict[str, str], result: Path) -> float:
    # cwd: not the repository, whose mbr_launch ``python -m`` would import ahead of PYTHONPATH's
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=result.parent,
                            start_new_session=True)
    drains = [threading.Thread(target=lambda s=s: [None for _ in iter(lambda: s.read1(1 << 16), b"")], daemon=True)
              for s in (proc.stdout, proc.stderr)]
    for d in drains:
        d.start()
    if proc.wait(300) != 0:
        raise SystemExit(f"{argv} failed with {proc.returncode}")
    for d in drains:
        d.join(10)
    return float(result.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--baseline", help="a git revision to compare with (e.g. main)")
    parser.add_argument("--out", type=Path, help="write a section into this results file")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-output-") as tmp:
        root = Path(tmp)
        worker, result = root / "worker.py", root / "elapsed.txt"
        worker.write_text(WORKER.replace("{lines}", str(args.lines)))
        trees = {"this tree": None}
        if args.baseline:
            trees[args.baseline] = snapshot(args.baseline, root / "baseline")
        rows = []
        launch = [sys.executable, "-m", "mbr_launch", "--nproc-per-node", "1", "--skip-check", "all",
                  "--status", "off", "--log-dir", str(root / "logs")]
        variants = {"direct (no launcher)": [sys.executable, str(worker), str(result)],
                    "mbr-launch, console": [*launch, str(worker), str(result)],
                    "mbr-launch --tee 3": [*launch, "--tee", "3", str(worker), str(result)]}
        for name, argv in variants.items():
            for tree, path in trees.items():
                if name.startswith("direct") and tree != "this tree":
                    continue
                env = launcher_env()
                env["PYTHONPATH"] = str(path or REPO)
                times = [_run(argv, env, result) for _ in range(args.trials)]
                label = name if name.startswith("direct") else f"{name} ({tree})"
                rows.append(f"| {label} | {args.trials} | {statistics.median(times):.2f} s | "
                            f"{min(times):.2f} / {max(times):.2f} s |")
                print(rows[-1], flush=True)
    mb = args.lines * 100 / 1e6
    body = "\n".join([
        f"## Worker output: {mb:.0f} MB in {args.lines // 1000}k lines, time the worker spends writing", "",
        *machine_lines(gpu=False, mbr_code="working tree"),
        f"- command: `python benchmarks/bench_output.py --trials {args.trials}"
        + (f" --baseline {args.baseline}" if args.baseline else "") + "`",
        "- the launcher's stdout and stderr are pipes drained by the bench (not a terminal)", "",
        "| run | trials | median | min / max |", "|---|---|---|---|", *rows])
    print(body)
    if args.out:
        write_section(args.out, "bench_output", body)


if __name__ == "__main__":
    main()
