"""Crash restart: SIGKILL one of 2 ready ranks, measure success and kill -> restarted-ranks-ready latency.

Each trial: start the launcher (--standalone, 2 ranks, --max-restarts 1) on workers/collective.py, wait until
both ranks wrote their restart-0 ready line (they then all_reduce every 50 ms), SIGKILL rank 1 (pid from its
ready line), and wait for both restart-1 ready lines. latency = max(restart-1 ready times) - t_kill.
A trial fails when the launcher exits non-zero, or restart-1 readiness takes over --deadline seconds (hang:
everything is killed). Launchers run interleaved, in rotating order per trial.

For mbr-launch the restart is broken down from its events.jsonl: kill -> failure event -> old workers
stopped -> rendezvous done -> new workers spawned -> ready. A bare ``python -c "import torch"`` runs in
the same rotation as a yardstick for the Python start-up inside the last step.

    python benchmarks/bench_restart.py --trials 20 --out benchmarks/RESULTS.md
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness as h  # noqa: E402
from testkit.eventlog import first_event  # noqa: E402  (harness puts the repository on sys.path)

SECTION = "bench_restart"
CHOICES = ["mbr-launch", "torchrun", "torchrun-noshare", "ft_launcher"]


def restart_trial(launcher: h.Launcher, root: Path, index: int, *, nproc: int, gpu: bool,
                  deadline: float) -> dict:
    def spec(d: Path) -> h.LaunchSpec:
        return h.LaunchSpec(nproc=nproc, max_restarts=1, log_dir=d / "logs",
                            worker=h.worker_argv(d / "ready", hold=deadline + 60, gpu=gpu))

    rec: dict = {"launcher": launcher.name, "trial": index, "ok": False, "latency": None, "reason": ""}
    with h.Trial(launcher, spec, root, index) as t:
        assert t.proc
        state, ready0 = h.wait_ready(t.proc, t.ready_file, restart=0, nproc=nproc, timeout=deadline)
        if state != "ready":
            rec["reason"] = h.failure_reason(t.proc, f"first start: {state} (rc {t.proc.returncode})")
            return rec
        rec["startup"] = max(r.time for r in ready0.values()) - t.proc.t0_wall
        victim = ready0[nproc - 1]
        since = t.proc.stderr_size()
        t_kill = rec["t_kill"] = time.time()
        os.kill(victim.pid, signal.SIGKILL)
        state, ready1 = h.wait_ready(t.proc, t.ready_file, restart=1, nproc=nproc, timeout=deadline)
        if state == "ready":
            rec["latency"] = max(r.time for r in ready1.values()) - t_kill
            rc = t.proc.wait_exit(deadline)
            rec["rc"] = rc
            if rc == 0:
                rec["ok"] = True
            else:
                rec["reason"] = h.failure_reason(t.proc, "restarted, then " + (
                    f"exit code {rc}" if rc is not None else f"no exit within {deadline:.0f} s"), since=since)
        else:
            rec["rc"] = t.proc.returncode
            what = (f"hang: restart-1 ranks not ready {deadline:.0f} s after the kill "
                    f"({len(ready1)} of {nproc} ready)" if state == "timeout"
                    else f"launcher exited {t.proc.returncode} before the restarted ranks were ready")
            rec["reason"] = h.failure_reason(t.proc, what, since=since)
        if launcher.name.split("@")[0] == "mbr-launch":
            rec["breakdown"] = breakdown(h.read_events(t.spec.log_dir), t_kill, ready1)
    rec["leftovers"] = t.leftovers
    return rec


def breakdown(events: list[dict], t_kill: float, ready1: dict[int, h.Ready]) -> dict | None:
    """Segments of one mbr-launch restart (seconds), from its event timestamps and the ready lines."""
    failure = first_event(events, "failure", round=0)
    rdzv = next((e for e in events if e["event"] == "rendezvous" and (e.get("restart_count") or 0) >= 1), None)
    if not failure or not rdzv or not ready1:
        return None
    t_fail = h.parse_ts(failure["ts"])
    exits = [h.parse_ts(e["ts"]) for e in events if e["event"] == "worker_exit" and e.get("round") == 0]
    t_stopped = max([t_fail, *exits])
    t_rdzv = h.parse_ts(rdzv["ts"])
    starts = [h.parse_ts(e["ts"]) for e in events if e["event"] == "worker_start" and e.get("round") == rdzv["round"]]
    if not starts:
        return None
    t_started = max(starts)
    return {
        "detect": t_fail - t_kill,  # kill -> failure event
        "stop": t_stopped - t_fail,  # failure -> old workers reaped
        "rendezvous": t_rdzv - t_stopped,  # -> next round's rendezvous done
        "spawn": t_started - t_rdzv,  # -> last new worker spawned
        "boot": max(r.time for r in ready1.values()) - t_started,  # python + import torch + init + all_reduce
        "first_failure": f"rank {failure.get('rank')} {failure.get('cause')} "
                         f"exit {failure.get('exit_code')} signal {failure.get('signal')}",
    }


def render(records: list[dict], names: list[str], ref: list[float], args: argparse.Namespace) -> str:
    by = {n: [r for r in records if r["launcher"] == n] for n in names}
    lat = {n: h.summarize([r["latency"] for r in by[n] if r["ok"]]) for n in names}
    rows = []
    for n in names:
        ok = sum(r["ok"] for r in by[n])
        rows.append([f"{n}" + (f" ({h.LAUNCHERS[n].note})" if h.LAUNCHERS[n].note else ""), len(by[n]), ok,
                     f"{100 * ok / len(by[n]):.0f}%" if by[n] else "-", h.fmt_s(lat[n] and lat[n].median),
                     h.fmt_iqr(lat[n]), h.ratio(lat[n], lat.get(h.BASELINE)), h.ratio(lat[n], lat.get(h.TORCHRUN))])
    out = [f"## Crash restart: SIGKILL 1 of {args.nproc} ranks -> restarted ranks ready", "",
           *h.machine_lines(gpu=args.gpu, mbr_code=args.mbr_code), f"- command: `{h.command_line()}`",
           f"- load average at end {os.getloadavg()[0]:.2f}; deadline {args.deadline:.0f} s per phase; "
           "latency over successful trials only", "",
           h.table(["launcher", "trials", "successes", "success %", "median latency", "p25 / p75",
                    "ratio vs ft_launcher", "ratio vs torchrun"], rows), ""]
    if "mbr-launch" in by and h.BASELINE in by:
        pair = h.paired_ratios({r["trial"]: r["latency"] for r in by["mbr-launch"] if r["ok"]},
                               {r["trial"]: r["latency"] for r in by[h.BASELINE] if r["ok"]})
        if pair:
            out += [f"Paired per-trial ratio mbr-launch / ft_launcher: median {pair.median:.2f}x "
                    f"(p25 {pair.p25:.2f}x, p75 {pair.p75:.2f}x, {pair.n} trials).", ""]
    start = {n: h.summarize([r["startup"] for r in by[n] if r.get("startup") is not None]) for n in names}
    out += ["Launch -> restart-0 ranks ready (same trials): " + "; ".join(
        f"{n} {h.fmt_s(s.median)}" for n, s in start.items() if s) + ".", ""]
    refs = h.summarize(ref)
    if refs:
        out += [f"Reference, same run: `python -c \"import torch\"` wall time median {refs.median:.3f} s "
                f"(p25 {refs.p25:.3f}, p75 {refs.p75:.3f}, {refs.n} runs).", ""]
    bds = [r["breakdown"] for r in by.get("mbr-launch", []) if r["ok"] and r.get("breakdown")]
    if bds:
        keys = [("detect", "kill -> failure event"), ("stop", "failure -> old workers reaped"),
                ("rendezvous", "-> rendezvous of the next round done"), ("spawn", "-> new workers spawned"),
                ("boot", "-> ready (python, import torch, init_process_group, all_reduce)")]
        brows = []
        for key, label in keys:
            s = h.summarize([b[key] for b in bds])
            assert s
            brows.append([label, h.fmt_s(s.median), h.fmt_iqr(s)])
        total = h.summarize([r["latency"] for r in by["mbr-launch"] if r["ok"] and r.get("breakdown")])
        brows.append(["total (kill -> ready)", h.fmt_s(total and total.median), h.fmt_iqr(total)])
        causes: dict[str, int] = {}
        for b in bds:
            causes[b["first_failure"]] = causes.get(b["first_failure"], 0) + 1
        out += ["mbr-launch restart breakdown (events.jsonl timestamps, ms resolution; medians per segment):", "",
                h.table(["segment", "median", "p25 / p75"], brows), "",
                "First failure event: " + "; ".join(f"{k} ({v}x)" for k, v in causes.items()) + ".", ""]
    out += h.failure_lines(records)
    return "\n".join(out)


def main() -> int:
    parser = h.bench_parser(__doc__, trials=20, choices=CHOICES)
    parser.add_argument("--deadline", type=float, default=60.0, help="seconds allowed per phase")
    parser.add_argument("--no-reference", action="store_true", help='skip the `import torch` yardstick')
    args = parser.parse_args()
    session = h.start(args, "restart")
    launchers = session.with_baseline(h.pick_launchers(args.launchers, CHOICES, mbr_path=session.mbr_path))
    rotation = launchers + ([] if args.no_reference else [h.LAUNCHERS["import-torch"]])
    ref: list[float] = []

    def run(step: h.Step) -> dict | None:
        launcher = step.item
        if launcher.reference:  # the yardstick's wall times go beside the table, not into it
            wall = reference_run(launcher, session.root, step.trial)
            if wall is not None:
                ref.append(wall)
            return None
        return restart_trial(launcher, session.root, step.trial, nproc=args.nproc, gpu=args.gpu,
                             deadline=args.deadline)

    done = h.run_trials(args, session, h.plan(rotation, args.trials), run, lambda r: f"ok {r['latency']:.3f} s",
                        width=17)
    text = render(done.records, [l.name for l in launchers], ref, args)
    return h.publish(args, SECTION, text, done.records)


def reference_run(launcher: h.Launcher, root: Path, index: int) -> float | None:
    """Wall time of one reference command (import torch), through the same Trial plumbing."""
    spec = lambda d: h.LaunchSpec(nproc=1, max_restarts=0, worker=[], log_dir=d)  # noqa: E731
    rec = h.run_to_exit(launcher, spec, root, index, timeout=60)
    return rec["wall"] if rec["rc"] == 0 else None


if __name__ == "__main__":
    sys.exit(main())
