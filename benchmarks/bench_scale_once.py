"""Many agents started at once, no fault (issue #38): ``--agents`` (32) launchers of one rank each, every one
started in the same instant (no store host first: a user's ``srun`` or script starts them together), with
default flags, in one c10d rendezvous; each rank runs tests/scripts/many_agents_worker.py as a plain job: a gloo
process group, ``--steps`` optimizer steps each followed by an all_reduce, exit 0. torchrun and mbr-launch run
in the same session, alternating which goes first per trial.

Reported per launcher: trials in which every agent exited 0, the exit codes seen, launch -> every rank's first
step, launch -> the last agent's exit (the job's wall time) and mbr-launch's wall time over torchrun's in the
same trial; the load average before each launch (the machine may be shared).

    python benchmarks/bench_scale_once.py --agents 32 --trials 1 --out benchmarks/RESULTS.md
    python benchmarks/bench_scale_once.py --agents 32 --before /tmp/old/   # also mbr_launch of /tmp/old/mbr_launch
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness as h  # noqa: E402
from harness.machine import Cost, run_quiet  # noqa: E402
from harness.reports import finish_dir, work_dir  # noqa: E402

SECTION = "bench_scale_once"
WORKER = h.REPO / "tests" / "scripts" / "many_agents_worker.py"
LAUNCHERS = ("torchrun", "mbr-launch", "mbr-launch@before")  # the last: --before's code


def _first_steps(ready: Path) -> dict[int, float]:
    """rank -> time of its first optimizer step (the worker's ``ready`` line)."""
    out: dict[int, float] = {}
    try:
        lines = ready.read_text().splitlines()
    except FileNotFoundError:
        return out
    for line in lines:
        parts = line.split()
        if len(parts) == 5 and parts[0] == "ready":
            out[int(parts[1])] = float(parts[3])
    return out


def trial(name: str, root: Path, index: int, args: argparse.Namespace) -> dict:
    n = args.agents
    d = root / f"{index:03d}-{name}"
    d.mkdir(parents=True)
    ready, gen_file, sleep_dir = d / "ready", d / "generation", d / "sleep"
    gen_file.write_text("0")
    sleep_dir.mkdir()
    port, token = h.free_port(), uuid.uuid4().hex
    src = args.before if name == "mbr-launch@before" else args.mbr_path if name == "mbr-launch" else None
    env = h.bench_env(token, h.mbr_env(src))
    # --final 0: the first generation is the last: --steps steps, then exit 0
    worker = [str(WORKER), "--ready-file", str(ready), "--gen-file", str(gen_file), "--sleep-dir", str(sleep_dir),
              "--final", "0", "--steps", str(args.steps)]
    head = [h.tool("torchrun")] if name == "torchrun" else [sys.executable, "-m", "mbr_launch"] if src \
        else [h.tool("mbr-launch")]
    rec: dict = {"launcher": name, "trial": index, "agents": n, "ok": False, "reason": "",
                 "load_before": os.getloadavg()[0]}
    procs: list[h.Proc] = []
    cost = Cost(started=lambda: len(_first_steps(ready)) >= n)
    try:
        t0 = time.time()
        for i in range(n):  # all at once: nothing waits for the store's host
            argv = [*head, "--nnodes", str(n), "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                    "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"o{port}",
                    *(["--log-dir", str(d / f"logs{i}")] if name == "mbr-launch" else []), *worker]
            procs.append(h.Proc(argv, env=env, out_dir=d, name=f"agent{i}"))  # cwd: the trial's, not the tree
        end = time.monotonic() + args.deadline
        codes = [p.wait_exit(max(0.0, end - time.monotonic())) for p in procs]
        rec["wall"] = max(p.t_exit or time.monotonic() for p in procs) - min(p.t0 for p in procs)
        rec["codes"] = codes
        steps = _first_steps(ready)
        rec["stepped"] = len(steps)
        if len(steps) == n:
            rec["first_step_all"] = max(steps.values()) - t0
        rec["ok"] = all(c == 0 for c in codes)
        if not rec["ok"]:
            rec["reason"] = h.first_failed(procs, f"exit codes {dict(Counter(codes))}")
        return rec
    finally:
        rec["load_after"] = os.getloadavg()[0]
        h.end_agents(procs, token, rec)
        rec.update(cost.stop())


def _each(values: list) -> str:
    """Every trial's value, in trial order ('-': none, e.g. a launch cut before every rank stepped)."""
    return ", ".join("-" if v is None else f"{v:.1f}" for v in values)


def render(records: list[dict], args: argparse.Namespace, code: str) -> str:
    rows = []
    for name in LAUNCHERS:
        rs = [r for r in records if r["launcher"] == name]
        if not rs:
            continue
        codes = Counter(c for r in rs for c in r.get("codes", []))
        ok = [r for r in rs if r["ok"]]
        rows.append([name, f"{len(ok)}/{len(rs)}", ", ".join(f"{c}: {k}" for c, k in sorted(codes.items(), key=str)),
                     h.fmt_cell(h.summarize([r["first_step_all"] for r in rs if "first_step_all" in r])),
                     h.fmt_cell(h.summarize([r["wall"] for r in rs])),
                     h.fmt_cell(h.summarize([r["wall"] for r in ok])),
                     _each([r["cpu_s"].get("first_step") for r in rs]), _each([r["cpu_s"]["end"] for r in rs]),
                     _each([r["peak_mem_gib"] for r in rs])])
    pairs: dict[int, dict[str, dict]] = {}
    for r in records:
        pairs.setdefault(r["trial"], {})[r["launcher"]] = r

    def ratios(name: str) -> str:
        found = [p[name]["wall"] / p["torchrun"]["wall"] for p in pairs.values()
                 if {name, "torchrun"} <= set(p) and p[name]["ok"] and p["torchrun"]["ok"]]
        return ", ".join(f"{x:.2f}" for x in found) if found else "none"
    out = [f"### {args.agents} agents started at once, no fault, default flags", "",
           *h.machine_lines(gpu=False, mbr_code=code), f"- command: `{h.command_line()}`",
           f"- worker: tests/scripts/many_agents_worker.py, {args.steps} optimizer steps + all_reduce each; "
           "load average (1 min) before each launch: "
           + ", ".join(f"{r['launcher']}#{r['trial']} {r['load_before']:.1f}" for r in records), "",
           h.table(["launcher", "trials with every agent exit 0", "exit codes (code: agents)",
                    "launch -> every rank's first step (s)", "launch -> last agent exited (s), all trials",
                    "same, ok trials", "machine CPU s to every first step", "machine CPU s, whole launch",
                    "peak memory over the start (GiB)"], rows), "",
           "CPU and memory are the whole machine's (every process, not only the launch's): meaningful only when "
           "nothing else runs; `load average before` says.", "",
           *(f"- {name} wall time / torchrun's, same trial, both ok: {ratios(name)}" for name in LAUNCHERS[1:]
             if any(r["launcher"] == name for r in records)), ""]
    failed = [r for r in records if not r["ok"]]
    if failed:
        out += ["Failed:", ""] + [f"- {r['launcher']} trial {r['trial']}: {r['reason']}" for r in failed] + [""]
    return "\n".join(out)


def _code() -> str:
    rev = run_quiet(["git", "-C", str(h.REPO), "rev-parse", "--short", "HEAD"])
    dirty = run_quiet(["git", "-C", str(h.REPO), "status", "--porcelain", "--untracked-files=no", "--", "mbr_launch"])
    return f"the working tree at {rev}{' with changes' if dirty else ''}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", type=int, default=32)
    ap.add_argument("--trials", type=int, default=1)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--launchers", default=",".join(LAUNCHERS[:2]))
    ap.add_argument("--deadline", type=float, default=400.0, help="seconds a launch may take before it is killed")
    ap.add_argument("--mbr-path", type=Path, help="run mbr_launch from this directory (PYTHONPATH), e.g. a "
                    "`git archive` of the code before a change")
    ap.add_argument("--before", type=Path, help="mbr_launch of the code before a change (e.g. `git archive REV "
                    "mbr_launch | tar -x -C DIR`), run as the launcher mbr-launch@before")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--raw", type=Path)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    names = [x for x in args.launchers.split(",") if x] + (["mbr-launch@before"] if args.before else [])
    h.stop_on_sigterm()
    root = work_dir("scale-once")
    records: list[dict] = []
    try:
        for i in range(args.trials):
            for name in h.rotate(names, i):
                rec = trial(name, root, i, args)
                records.append(rec)
                print(f"[trial {i} {name}] ok={rec['ok']} wall={rec.get('wall', 0):.1f} s "
                      f"codes={dict(Counter(rec.get('codes', [])))} load {rec['load_before']:.1f} {rec['reason']}",
                      flush=True)
    finally:
        finish_dir(root, args.keep)
    h.write_raw(args.raw, records)
    code = f"mbr_launch from {args.mbr_path}" if args.mbr_path else _code()
    if args.before:
        code += f"; mbr-launch@before: mbr_launch from {args.before}"
    text = render(records, args, code)
    print(text)
    if args.out:
        h.write_section(args.out, SECTION, text)
    return 0 if records and all(r["ok"] for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
