"""Warm standbys: mbr-launch with and without ``--standby`` against torchrun, restart and cold launch.

Restart: start 2 ranks (--max-restarts 1, workers/collective.py), wait until both are ready, let the job run
``--settle`` seconds (a crash seldom comes in the first seconds; the replacement standbys prepare meanwhile),
SIGKILL rank 1, and measure kill -> both restarted ranks ready. Cold: launcher start -> exit for 2 ranks that
init, all_reduce once and exit (and start -> first all_reduce done). Every launcher runs interleaved, in a
rotating order per trial, so load changes on the shared machine land on all alike; ``import-torch`` runs in
the same rotation as a yardstick. mbr-launch's restarts are broken down from its events.jsonl.

    python benchmarks/bench_standby.py --trials 10 --out benchmarks/out/standby.md
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness as h  # noqa: E402
from bench_cold import breakdown as cold_breakdown  # noqa: E402
from bench_restart import breakdown as restart_breakdown  # noqa: E402

SECTION = "bench_standby"
RESTART_TARGET, GPU_RESTART_TARGET, COLD_TARGET = 0.35, 0.4, 0.8  # the targets, fractions of torchrun's


def _mbr(level: str) -> h.Launcher:
    def argv(s: h.LaunchSpec) -> list[str]:
        base = h.LAUNCHERS["mbr-launch"].argv(s)
        return [base[0], "--standby", level, *base[1:]]

    return h.Launcher(f"mbr-{level}", argv, note=f"--standby {level}")


def launchers(names: str, mbr_path: Path | None) -> list[h.Launcher]:
    table = {"mbr-torch": _mbr("torch"), "mbr-off": _mbr("off"), "mbr-interpreter": _mbr("interpreter"),
             "mbr-cuda": _mbr("cuda"),
             "torchrun": h.LAUNCHERS["torchrun-noshare"], "torchrun-shared": h.LAUNCHERS["torchrun"],
             "ft_launcher": h.LAUNCHERS["ft_launcher"], "import-torch": h.LAUNCHERS["import-torch"]}
    chosen = []
    for name in filter(None, (n.strip() for n in names.split(","))):
        if name not in table:
            raise SystemExit(f"--launchers: unknown {name!r}; choose from {', '.join(table)}")
        chosen.append(h.with_mbr_path(replace(table[name], name=name), mbr_path))
    return chosen


def restart_trial(launcher: h.Launcher, root: Path, index: int, *, settle: float, deadline: float,
                  gpu: bool) -> dict:
    rec: dict = {"phase": "restart", "launcher": launcher.name, "trial": index, "ok": False, "latency": None,
                 "reason": ""}
    if launcher.reference:
        rec.update(h.run_to_exit(launcher, lambda d: h.LaunchSpec(2, 0, [], d / "logs"), root, index,
                                 timeout=deadline))
        rec["ok"], rec["latency"] = rec["rc"] == 0, rec["wall"]
        return rec

    def spec(d: Path) -> h.LaunchSpec:
        return h.LaunchSpec(nproc=2, max_restarts=1, log_dir=d / "logs",
                            worker=h.worker_argv(d / "ready", hold=settle + deadline + 60, gpu=gpu))

    with h.Trial(launcher, spec, root, index) as t:
        assert t.proc
        state, ready0 = h.wait_ready(t.proc, t.ready_file, restart=0, nproc=2, timeout=deadline)
        if state != "ready":
            rec["reason"] = h.failure_reason(t.proc, f"first start: {state}")
            return rec
        time.sleep(settle)
        t_kill = time.time()
        os.kill(ready0[1].pid, signal.SIGKILL)
        state, ready1 = h.wait_ready(t.proc, t.ready_file, restart=1, nproc=2, timeout=deadline)
        if state != "ready":
            rec["reason"] = h.failure_reason(t.proc, f"restart: {state}")
            return rec
        rec["latency"] = max(r.time for r in ready1.values()) - t_kill
        rec["rc"] = t.proc.wait_exit(deadline)
        rec["ok"] = rec["rc"] == 0
        if not rec["ok"]:
            rec["reason"] = h.failure_reason(t.proc, f"exit code {rec['rc']}")
        if launcher.name.startswith("mbr-"):
            events = h.read_events(t.spec.log_dir)
            rec["breakdown"] = restart_breakdown(events, t_kill, ready1)
            rec["warm"] = [e.get("standby") for e in events if e["event"] == "worker_start" and e["round"] == 1]
    return rec


def cold_trial(launcher: h.Launcher, root: Path, index: int, *, timeout: float, gpu: bool) -> dict:
    def spec(d: Path) -> h.LaunchSpec:
        return h.LaunchSpec(nproc=2, max_restarts=0, log_dir=d / "logs",
                            worker=h.worker_argv(d / "ready", hold=0, gpu=gpu, steps=0))

    rec = h.run_to_exit(launcher, spec, root, index, timeout=timeout)
    rec["phase"] = "cold"
    ready = [r for r in rec.pop("ready") if r.restart == 0]
    rec["ok"] = rec["rc"] == 0 and (launcher.reference or len(ready) >= 2)
    rec["first_step"] = max(r.time for r in ready) - rec["t0_wall"] if ready and rec["ok"] else None
    if launcher.name.startswith("mbr-") and rec["ok"]:
        rec["breakdown"] = cold_breakdown(h.read_events(Path(rec["dir"]) / "logs"), rec, ready)
    return rec


def render(records: list[dict], chosen: list[h.Launcher], args: argparse.Namespace) -> str:
    names = [l.name for l in chosen]
    notes = {l.name: l.note for l in chosen}
    out = [f"## {args.title}, 2 ranks, {'nccl on GPUs' if args.gpu else 'gloo on CPU'}",
           "", *h.machine_lines(gpu=args.gpu, mbr_code=args.mbr_code), f"- command: `{h.command_line()}`",
           f"- load average at end {os.getloadavg()[0]:.2f}; timings over successful trials only; "
           f"restart: kill after {args.settle:g} s of steady all_reduces", "",
           "torchrun: `torchrun --standalone --nproc-per-node 2 --max-restarts 1` with "
           "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (its restarts fail without it).", ""]
    restart_target = GPU_RESTART_TARGET if args.gpu else RESTART_TARGET
    for phase, key, target, title in (("restart", "latency", restart_target, "kill -> both restarted ranks ready"),
                                      ("cold", "wall", COLD_TARGET, "launcher start -> exit")):
        by = {n: [r for r in records if r["phase"] == phase and r["launcher"] == n] for n in names}
        if not any(by.values()):
            continue
        stats = {n: h.summarize([r[key] for r in rs if r["ok"]]) for n, rs in by.items()}
        with_ft = bool(by.get("ft_launcher"))
        rows = []
        for n, rs in by.items():
            if not rs:
                continue
            pair = h.paired_ratios({r["trial"]: r[key] for r in rs if r["ok"]},
                                   {r["trial"]: r[key] for r in by.get("torchrun", []) if r["ok"]})
            extra = []
            if phase == "cold":
                first = h.summarize([r["first_step"] for r in rs if r["ok"] and r.get("first_step") is not None])
                extra = [h.fmt_s(first and first.median)]
            rows.append([n + (f" ({notes[n]})" if notes[n] else ""),
                         f"{sum(r['ok'] for r in rs)}/{len(rs)}", h.fmt_s(stats[n] and stats[n].median),
                         h.fmt_iqr(stats[n]), *extra, h.ratio(stats[n], stats.get("torchrun")),
                         f"{pair.median:.2f}x" if pair and n != "torchrun" else "-",
                         *([h.ratio(stats[n], stats.get("ft_launcher"))] if with_ft else [])])
        header = ["launcher", "ok", f"median {title}", "p25 / p75",
                  *(["median start -> first all_reduce"] if phase == "cold" else []),
                  "ratio of medians vs torchrun", f"paired per-trial ratio vs torchrun (target <= {target}x)",
                  *(["ratio of medians vs ft_launcher"] if with_ft else [])]
        out += [f"### {phase.capitalize()}: {title}", "", h.table(header, rows), ""]
        for n in names:
            bds = [r["breakdown"] for r in by.get(n, []) if r.get("breakdown")]
            if not bds or not n.startswith("mbr-"):
                continue
            keys = (["detect", "stop", "rendezvous", "spawn", "boot"] if phase == "restart"
                    else ["cli", "rendezvous", "spawn", "boot", "finish", "teardown"])
            cells = [h.fmt_s(s.median) if (s := h.summarize([b[k] for b in bds])) else "-" for k in keys]
            out += [f"{n} {phase} breakdown (medians; events.jsonl):", "", h.table(keys, [cells]), ""]
            if phase == "restart":
                warm = [all(r.get("warm") or [False]) for r in by[n] if r["ok"]]
                out += [f"{n}: restarted ranks taken from standbys in {sum(warm)} of {len(warm)} trials.", ""]
    out += h.failure_lines(records, label=lambda r: f"{r['phase']} {r['launcher']} trial {r['trial']}",
                           leftovers=None)
    return "\n".join(out)


def main() -> int:
    parser = h.bench_parser(__doc__, trials=10, choices=[], default="mbr-torch,mbr-off,torchrun,import-torch",
                            launchers_help="mbr-torch, mbr-off, mbr-interpreter, mbr-cuda, torchrun (no shared store), "
                                           "torchrun-shared (torch's default store), ft_launcher, import-torch",
                            nproc=False)
    parser.add_argument("--phases", default="restart,cold")
    parser.add_argument("--settle", type=float, default=8.0, help="seconds of steady running before the kill")
    parser.add_argument("--deadline", type=float, default=60.0, help="seconds allowed per phase of a trial")
    parser.add_argument("--first-trial", type=int, default=0,
                        help="number the trials from N (to continue an earlier run given with --merge)")
    parser.add_argument("--merge", type=Path, action="append", default=[],
                        help="also report the trials in this --raw file of an earlier run (repeatable)")
    parser.add_argument("--section", default=SECTION, help="the RESULTS.md section this report replaces")
    parser.add_argument("--title", default="Warm standbys: restart and cold launch")
    args = parser.parse_args()
    session = h.start(args, "standby")
    chosen = launchers(args.launchers, session.mbr_path)
    merged = [rec for path in args.merge for rec in json.loads(path.read_text())]

    def run(step: h.Step) -> dict:
        root = session.root / step.phase
        if step.phase == "restart":
            return restart_trial(step.item, root, step.trial, settle=args.settle, deadline=args.deadline,
                                 gpu=args.gpu)
        return cold_trial(step.item, root, step.trial, timeout=args.deadline, gpu=args.gpu)

    def status(rec: dict) -> str:
        return f"ok {rec.get('latency') if rec['phase'] == 'restart' else rec.get('wall'):.3f} s"

    steps = h.plan(chosen, args.trials, first=args.first_trial, phases=args.phases.split(","))
    done = h.run_trials(args, session, steps, run, status, width=16, records=merged)
    return h.publish(args, args.section, render(done.records, chosen, args), done.records)


if __name__ == "__main__":
    sys.exit(main())
