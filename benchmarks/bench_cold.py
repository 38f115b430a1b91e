"""Cold launch: launcher start -> exit for 2 ranks that init a process group, all_reduce once and exit.

Reports the wall time (launcher start -> launcher exit, exact via pidfd) and the time to the first
all_reduce done (launcher start -> the later rank's ready line). Launchers run interleaved, in rotating
order per trial, together with two yardsticks in the same rotation: ``bare`` (the 2 ranks started by sh
with torchrun's environment variables, no launcher: the floor) and ``import-torch``.

    python benchmarks/bench_cold.py --trials 10 --out benchmarks/RESULTS.md
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness as h  # noqa: E402

SECTION = "bench_cold"
CHOICES = ["mbr-launch", "torchrun", "ft_launcher", "torchrun-noshare"]
REFERENCES = ["bare", "import-torch"]
TARGET = 0.8  # issue "benchmarks": mbr-launch at most 0.8x torchrun


def cold_trial(launcher: h.Launcher, root: Path, index: int, *, nproc: int, gpu: bool, timeout: float) -> dict:
    def spec(d: Path) -> h.LaunchSpec:
        return h.LaunchSpec(nproc=nproc, max_restarts=0, log_dir=d / "logs",
                            worker=h.worker_argv(d / "ready", hold=0, gpu=gpu, steps=0))

    rec = h.run_to_exit(launcher, spec, root, index, timeout=timeout)
    ready = [r for r in rec.pop("ready") if r.restart == 0]
    wants_ready = launcher.name != "import-torch"
    rec["ok"] = rec["rc"] == 0 and (len(ready) >= nproc or not wants_ready)
    if rec["rc"] == 0 and not rec["ok"]:
        rec["reason"] = f"exit 0 but {len(ready)} of {nproc} ranks ready"
    rec["first_step"] = max(r.time for r in ready) - rec["t0_wall"] if wants_ready and rec["ok"] else None
    if launcher.name.startswith("mbr-launch") and rec["ok"]:
        rec["breakdown"] = breakdown(h.read_events(Path(rec["dir"]) / "logs"), rec, ready)
    return rec


def breakdown(events: list[dict], rec: dict, ready: list[h.Ready]) -> dict | None:
    """Segments of one mbr-launch cold launch (seconds), from its event timestamps and the ready lines."""
    ts = {}
    for e in events:
        ts.setdefault(e["event"], []).append(h.parse_ts(e["ts"]))
    if not all(k in ts for k in ("start", "rendezvous", "worker_start", "end")) or not ready:
        return None
    t0, spawned, t_ready = rec["t0_wall"], max(ts["worker_start"]), max(r.time for r in ready)
    return {"cli": ts["start"][0] - t0, "rendezvous": ts["rendezvous"][0] - ts["start"][0],
            "spawn": spawned - ts["rendezvous"][0], "boot": t_ready - spawned, "finish": ts["end"][0] - t_ready,
            "teardown": t0 + rec["wall"] - ts["end"][0]}


def render(records: list[dict], names: list[str], refs: list[str], args: argparse.Namespace) -> str:
    by = {n: [r for r in records if r["launcher"] == n] for n in [*names, *refs]}
    wall = {n: h.summarize([r["wall"] for r in rs if r["ok"]]) for n, rs in by.items()}
    step = {n: h.summarize([r["first_step"] for r in rs if r["ok"] and r["first_step"] is not None])
            for n, rs in by.items()}
    rows = []
    for n, rs in by.items():
        ok = sum(r["ok"] for r in rs)
        label = n + (f" ({h.LAUNCHERS[n].note})" if h.LAUNCHERS[n].note else "")
        rows.append([label, len(rs), ok, f"{100 * ok / len(rs):.0f}%" if rs else "-",
                     h.fmt_s(wall[n] and wall[n].median), h.fmt_iqr(wall[n]),
                     h.fmt_s(step[n] and step[n].median), h.fmt_iqr(step[n]),
                     h.ratio(wall[n], wall.get(h.BASELINE)), h.ratio(wall[n], wall.get(h.TORCHRUN))])
    out = [f"## Cold launch: {args.nproc} ranks init + one all_reduce + exit", "",
           *h.machine_lines(gpu=args.gpu, mbr_code=args.mbr_code), f"- command: `{h.command_line()}`",
           f"- load average at end {os.getloadavg()[0]:.2f}; timings over successful trials only", "",
           h.table(["launcher", "trials", "successes", "success %", "median wall (start -> exit)", "p25 / p75",
                    "median start -> first all_reduce done", "p25 / p75", "wall ratio vs ft_launcher",
                    "wall ratio vs torchrun"], rows), ""]
    if "mbr-launch" in by and h.TORCHRUN in by:
        pair = h.paired_ratios({r["trial"]: r["wall"] for r in by["mbr-launch"] if r["ok"]},
                               {r["trial"]: r["wall"] for r in by[h.TORCHRUN] if r["ok"]})
        if pair:
            verdict = "meets" if pair.median <= TARGET else "misses"
            out += [f"Paired per-trial wall ratio mbr-launch / torchrun: median {pair.median:.2f}x (p25 "
                    f"{pair.p25:.2f}x, p75 {pair.p75:.2f}x, {pair.n} trials): {verdict} the {TARGET}x target.", ""]
    for name in (n for n in by if n.startswith("mbr-launch")):  # with --mbr-baseline, each code's own
        bds = [r["breakdown"] for r in by[name] if r.get("breakdown")]
        if not bds:
            continue
        keys = [("cli", "launch -> start event (imports, config, preflight checks)"),
                ("rendezvous", "-> rendezvous done"), ("spawn", "-> workers spawned"),
                ("boot", "-> first all_reduce done (python, import torch, init_process_group)"),
                ("finish", "-> end event (workers exit, reaped)"), ("teardown", "-> launcher exited")]
        rows = [[label, h.fmt_s(s.median), h.fmt_iqr(s)] for key, label in keys
                if (s := h.summarize([b[key] for b in bds]))]
        out += [f"{name} cold-launch breakdown (events.jsonl timestamps, ms resolution; medians per segment):",
                "", h.table(["segment", "median", "p25 / p75"], rows), ""]
    out += h.failure_lines(records)
    return "\n".join(out)


def main() -> int:
    parser = h.bench_parser(__doc__, trials=10, choices=CHOICES, default="mbr-launch,torchrun,ft_launcher")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds allowed per launch")
    parser.add_argument("--no-reference", action="store_true", help="skip the bare and import-torch yardsticks")
    args = parser.parse_args()
    session = h.start(args, "cold")
    launchers = session.with_baseline(h.pick_launchers(args.launchers, CHOICES, mbr_path=session.mbr_path))
    refs = [] if args.no_reference else REFERENCES
    rotation = [*launchers, *(h.LAUNCHERS[n] for n in refs)]

    def status(rec: dict) -> str:
        return f"ok wall {rec['wall']:.3f} s" + (f", first all_reduce {rec['first_step']:.3f} s"
                                                 if rec["first_step"] is not None else "")

    done = h.run_trials(args, session, h.plan(rotation, args.trials),
                        lambda step: cold_trial(step.item, session.root, step.trial, nproc=args.nproc, gpu=args.gpu,
                                                timeout=args.timeout), status, width=17)
    text = render(done.records, [l.name for l in launchers], refs, args)
    return h.publish(args, SECTION, text, done.records)


if __name__ == "__main__":
    sys.exit(main())
