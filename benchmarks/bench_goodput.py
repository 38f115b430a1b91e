"""Goodput under repeated faults: a ``--duration`` (300 s) training run, SIGKILL of one rank every
``--fault-every`` (30 s), under each launcher in turn; how much of the wall time became kept training progress.

Worker: workers/goodput_train.py (2 ranks, DDP MLP + SGD, ``--step-time`` of simulated device work per step,
a checkpoint every ``--ckpt-every`` steps, resume from it after every restart). ``--variants`` runs it in two
ways, side by side under every launcher (interleaved in each trial): ``optimizer`` (DDP and ``torch.optim``),
and ``no-optimizer`` (the gradients all-reduced by hand and the parameters updated without ``torch.optim``: no
optimizer step for mbr-launch's step heartbeat to see, only collectives and checkpoints; issue #28 found its
restarts taken for a crash loop and backed off). Each variant gets its own table, its ratios taken against
the other launchers on the same variant. Faults alternate between
rank 1 and rank 0; a fault falls due every ``--fault-every`` seconds after the launch, and when it falls due
while a restart is still under way, it waits until the new ranks have made their first step (a kill during
start-up measures nothing new). At ``--duration`` the harness creates the stop file; the ranks save and
exit 0 together; the launcher must exit 0.

Goodput = final step x median step time / (launch -> launcher exit). The final step counts only kept
progress: steps lost since the last checkpoint are done again after each restart, and time spent starting,
detecting, restarting and redoing is all in the denominator. The median step time (consecutive steps of one
start) is the run's own pace, so the figure does not depend on the machine's speed. Per fault: kill ->
first step of the next start (downtime) and steps lost to the rollback.

    python benchmarks/bench_goodput.py --out benchmarks/RESULTS.md   # ~31 min: 3 launchers x 2 variants x 5 min
    python benchmarks/bench_goodput.py --duration 120 --fault-every 15   # issue #28's setting, ~13 min
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness as h  # noqa: E402

SECTION = "bench_goodput"
CHOICES = ["mbr-launch", "torchrun-noshare", "ft_launcher", "torchrun", "mbr-launch-dynamo"]
DEFAULT = "mbr-launch,torchrun-noshare,ft_launcher"
WORKER = h.WORKERS / "goodput_train.py"
VARIANTS = {"optimizer": [], "no-optimizer": ["--no-optimizer"]}  # name -> the worker's extra arguments


def read_progress(path: Path) -> list[tuple[int, int, float]]:
    """(step, restart, time) per line of the progress file, in file order."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        parts = line.split()
        if len(parts) == 4 and parts[0] == "step":
            out.append((int(parts[1]), int(parts[2]), float(parts[3])))
    return out


def step_time(progress: list[tuple[int, int, float]]) -> float | None:
    """The run's own pace: median gap between consecutive steps of the same start."""
    gaps = [b[2] - a[2] for a, b in zip(progress, progress[1:]) if b[1] == a[1] and b[0] == a[0] + 1]
    return statistics.median(gaps) if gaps else None


def per_fault(progress: list[tuple[int, int, float]], kills: list[dict]) -> list[dict]:
    """For each kill: downtime (kill -> first step of the next start) and steps lost to the rollback."""
    out = []
    for kill in kills:
        before = [p for p in progress if p[1] == kill["restart"] and p[2] <= kill["t"]]
        after = [p for p in progress if p[1] > kill["restart"]]
        if not before or not after:
            continue
        first = min(after, key=lambda p: p[2])
        out.append({"downtime": first[2] - kill["t"], "lost_steps": before[-1][0] - (first[0] - 1)})
    return out


def goodput_trial(launcher: h.Launcher, variant: str, root: Path, index: int, args: argparse.Namespace) -> dict:
    rec: dict = {"launcher": launcher.name, "variant": variant, "trial": index, "ok": False, "reason": "",
                 "kills": []}

    def spec(d: Path) -> h.LaunchSpec:
        worker = [str(WORKER), "--ready-file", str(d / "ready"), "--progress-file", str(d / "progress"),
                  "--stop-file", str(d / "stop"), "--ckpt", str(d / "ckpt.pt"), "--ckpt-every",
                  str(args.ckpt_every), "--step-time", str(args.step_time), *(["--gpu"] if args.gpu else []),
                  *VARIANTS[variant]]
        return h.LaunchSpec(nproc=2, max_restarts=args.max_restarts, worker=worker, log_dir=d / "logs")

    with h.Trial(launcher, spec, root / variant, index) as t:
        assert t.proc
        t0, due = t.proc.t0, t.proc.t0 + args.fault_every
        while time.monotonic() < t0 + args.duration:
            if t.proc.poll() is not None:
                rec["reason"] = h.failure_reason(t.proc, f"launcher exited early with {t.proc.returncode} after "
                                                         f"{len(rec['kills'])} faults")
                break
            if time.monotonic() >= due and _kill_one(t.ready_file, len(rec["kills"]) % 2, rec["kills"]):
                due += args.fault_every
            time.sleep(0.02)
        else:
            (t.dir / "stop").touch()
            rc = t.proc.wait_exit(args.deadline)
            rec["rc"] = rc
            if rc is None:
                rec["reason"] = h.failure_reason(t.proc, f"no exit within {args.deadline:.0f} s of the stop file")
            elif rc != 0:
                rec["reason"] = h.failure_reason(t.proc, f"exit code {rc}")
            else:
                rec["ok"] = True
                assert t.proc.t_exit is not None
                rec["wall"] = t.proc.t_exit - t0
        progress = read_progress(t.dir / "progress")
        rec["final_step"] = progress[-1][0] if progress else 0
        rec["step_time"] = step_time(progress)
        rec["restarts"] = max((r.restart for r in h.read_ready(t.ready_file)), default=0)
        rec["faults"] = per_fault(progress, rec["kills"])
        if rec["ok"] and rec["step_time"]:
            rec["goodput"] = rec["final_step"] * rec["step_time"] / rec["wall"]
        if launcher.name.startswith("mbr-launch"):
            events = h.read_events(t.spec.log_dir)
            own = [e for e in events if e["event"] == "goodput"]
            rec["own_goodput"] = own[-1]["goodput"] if own else None
            # the crash-loop back-off: each restart's delay (0 when the failed round showed progress)
            rec["backoffs"] = [e.get("backoff") or 0.0 for e in events if e["event"] == "restart"]
    rec["leftovers"] = t.leftovers
    return rec


def _kill_one(ready_file: Path, rank: int, kills: list[dict]) -> bool:
    """SIGKILL `rank` of the newest start once both of its ranks have stepped; False while that is not so."""
    ready = h.read_ready(ready_file)
    if not ready:
        return False
    newest = max(r.restart for r in ready)
    ranks = {r.rank: r for r in ready if r.restart == newest}
    if len(ranks) < 2 or any(k["restart"] == newest for k in kills):
        return False
    try:
        os.kill(ranks[rank].pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    kills.append({"t": time.time(), "restart": newest, "rank": rank})
    return True


def render(records: list[dict], names: list[str], variants: list[str], args: argparse.Namespace) -> str:
    out = [f"## Goodput: {args.duration:g} s of training, SIGKILL of one rank every {args.fault_every:g} s",
           "", *h.machine_lines(gpu=args.gpu, mbr_code=args.mbr_code), f"- command: `{h.command_line()}`",
           f"- load average at end {os.getloadavg()[0]:.2f}; 2 ranks, {args.step_time:g} s of simulated work per "
           f"step, checkpoint every {args.ckpt_every} steps; goodput = final step x median step time / "
           "(launch -> exit)", ""]
    for variant in variants:
        if len(variants) > 1 or variant != "optimizer":
            out += [f"### {variant}: " + ("DDP and torch.optim SGD" if variant == "optimizer" else
                                          "gradients all-reduced by hand, no torch.optim"), ""]
        out += _variant_table([r for r in records if r.get("variant", "optimizer") == variant], names)
    out += h.failure_lines(records, label=lambda r: f"{r['launcher']} ({r.get('variant', 'optimizer')}) trial "
                                                    f"{r['trial']}")
    return "\n".join(out)


def _variant_table(records: list[dict], names: list[str]) -> list[str]:
    out = []
    by = {n: [r for r in records if r["launcher"] == n] for n in names}
    good = {n: h.summarize([r["goodput"] for r in rs if r.get("goodput") is not None]) for n, rs in by.items()}
    rows = []
    for n, rs in by.items():
        ok = [r for r in rs if r["ok"]]
        faults = [f for r in ok for f in r["faults"]]
        down = h.summarize([f["downtime"] for f in faults])
        lost = h.summarize([f["lost_steps"] for f in faults])
        g = good[n]
        rows.append([f"{n} ({h.LAUNCHERS[n].note})" if h.LAUNCHERS[n].note else n, f"{len(ok)}/{len(rs)}",
                     "/".join(str(len(r["kills"])) for r in rs), "/".join(str(r["restarts"]) for r in rs),
                     "/".join(str(r["final_step"]) for r in rs),
                     h.fmt_s(statistics.median([r["step_time"] for r in ok if r["step_time"]]) if ok else None),
                     f"{g.median:.1%}" if g else "-", h.ratio(g, good.get("torchrun-noshare")),
                     h.ratio(g, good.get("ft_launcher")), h.fmt_s(down and down.median),
                     f"{lost.median:g}" if lost else "-"])
    out += [h.table(["launcher", "runs ok", "faults", "restarts", "final step", "median step", "goodput",
                     "vs torchrun-noshare", "vs ft_launcher", "median kill -> next step", "median steps lost"],
                    rows), ""]
    own = [f"{r['launcher']} {r['own_goodput']:.1%}" for r in records if r.get("own_goodput") is not None]
    if own:
        out += [f"mbr-launch's own goodput record (events.jsonl `goodput`, productive step time / wall, from its "
                f"step heartbeats): {', '.join(own)}.", ""]
    backed = [f"{r['launcher']} trial {r['trial']}: {sum(r['backoffs']):g} s in {sum(b > 0 for b in r['backoffs'])} "
              f"of {len(r['backoffs'])}" for r in records if r.get("backoffs") is not None]
    if backed:
        out += [f"mbr-launch's crash-loop back-off (restart events): {'; '.join(backed)} restarts.", ""]
    return out


def main() -> int:
    parser = h.bench_parser(__doc__, trials=1, choices=CHOICES, default=DEFAULT)
    parser.add_argument("--duration", type=float, default=300.0, help="seconds of training per run")
    parser.add_argument("--fault-every", type=float, default=30.0, help="seconds between faults")
    parser.add_argument("--step-time", type=float, default=0.05, help="simulated device work per step")
    parser.add_argument("--ckpt-every", type=int, default=20, help="steps between checkpoints")
    parser.add_argument("--max-restarts", type=int, default=100)
    parser.add_argument("--deadline", type=float, default=60.0, help="seconds allowed for the exit after stop")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"comma-separated subset of: {', '.join(VARIANTS)} (each runs under every launcher)")
    args = parser.parse_args()
    variants = h.variant_names(args.variants, VARIANTS, list(VARIANTS))
    session = h.start(args, "goodput")
    launchers = session.with_baseline(h.pick_launchers(args.launchers, CHOICES, mbr_path=session.mbr_path))
    items = [(launcher, variant) for variant in variants for launcher in launchers]
    done = h.run_trials(args, session, h.plan(items, args.trials),
                        lambda step: goodput_trial(*step.item, session.root, step.trial, args),
                        lambda r: f"{r['variant']:12s} goodput {r.get('goodput', 0.0):.1%}, {len(r['kills'])} faults, "
                                  f"final step {r['final_step']}", width=21)
    return h.publish(args, SECTION, render(done.records, [l.name for l in launchers], variants, args), done.records)


if __name__ == "__main__":
    sys.exit(main())
