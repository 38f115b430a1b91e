"""Hang detection: one rank stops heartbeating; detection latency past the timeout, and hang -> restarted ready.

The same worker (workers/ft_hang.py: NVRx RankMonitorClient heartbeat + gloo all_reduce every 50 ms) under
mbr-launch and NVRx ft_launcher, same flags: 2 ranks, ``--max-restarts 1``,
``--ft-initial-rank-heartbeat-timeout 60 --ft-rank-heartbeat-timeout 2``. On the first attempt rank 1 stops
before a heartbeat (``--hang-after`` s after it is ready) and writes its last heartbeat time to a file; the
timeout runs from that heartbeat, so the deadline is ``last heartbeat + 2 s``. Variants:

- mbr-launch with ``--stack-dump auto`` (its default: py-spy of every local rank before the kill) and ``off``;
  (not by default) ``--standby off``: the restarted ranks are fresh processes, as under the other launchers
  (mbr-launch's default ``--standby torch`` restarts into processes that imported torch ahead of time);
- ft_launcher with its default ``--ft-workload-check-interval`` (5 s) and with 0.5 s (its best case);
- torchrun (reference, every ``--torchrun-every``-th trial): no heartbeat monitor, so the hang is seen only
  when rank 0's all_reduce hits the process-group timeout (``--pg-timeout``, 20 s) and rank 0 exits.
  Run with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` so that its restart itself works (pytorch#135712; the
  shared-store failure rate is bench_restart's subject, not this one's).

Per trial: the hung rank's pid is watched with a pidfd (exact exit time, the common yardstick for every
launcher): detection = pid gone - (last heartbeat + timeout). Also, per launcher, its own record of the
detection: mbr-launch's ``hang`` event ``ts``, ft_launcher's ``Did not get subsequent heartbeat`` log line
(both ms resolution). hang -> ready = max(restart-1 ready times) - last heartbeat. A trial fails when the
restart-1 ranks are not ready within --deadline, or the launcher then does not exit 0.

    python benchmarks/bench_hang.py --trials 8 --out benchmarks/RESULTS.md
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness as h

SECTION = "bench_hang"
FT_HANG = h.WORKERS / "ft_hang.py"
TIMEOUT = 2.0
TIMEOUT_FLAGS = ["--ft-initial-rank-heartbeat-timeout", "60", "--ft-rank-heartbeat-timeout", f"{TIMEOUT:g}"]


def _mbr(*extra: str):
    def argv(s: h.LaunchSpec) -> list[str]:
        return [h.tool("mbr-launch"), "--standalone", "--nproc-per-node", str(s.nproc), "--max-restarts",
                str(s.max_restarts), "--log-dir", str(s.log_dir), *TIMEOUT_FLAGS, *extra, *s.worker]
    return argv


def _ft(*extra: str):
    def argv(s: h.LaunchSpec) -> list[str]:
        return [h.tool("ft_launcher"), "--standalone", "--nproc-per-node", str(s.nproc), "--max-restarts",
                str(s.max_restarts), *TIMEOUT_FLAGS, *extra, *s.worker]
    return argv


def _torchrun(s: h.LaunchSpec) -> list[str]:
    return [h.tool("torchrun"), "--standalone", "--nproc-per-node", str(s.nproc), "--max-restarts",
            str(s.max_restarts), *s.worker]


VARIANTS: dict[str, h.Launcher] = {
    "mbr-launch": h.Launcher("mbr-launch", _mbr(), note="--stack-dump auto (default)"),
    "mbr-launch-nodump": h.Launcher("mbr-launch-nodump", _mbr("--stack-dump", "off"), note="--stack-dump off"),
    "mbr-launch-nostandby": h.Launcher("mbr-launch-nostandby", _mbr("--standby", "off"),
                                       note="--standby off: fresh processes, like the other launchers"),
    "ft_launcher": h.Launcher("ft_launcher", _ft(), note="--ft-workload-check-interval 5 (default)"),
    "ft_launcher-0.5": h.Launcher("ft_launcher-0.5", _ft("--ft-workload-check-interval", "0.5"),
                                  note="--ft-workload-check-interval 0.5"),
    "torchrun": h.Launcher("torchrun", _torchrun, env={"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"},
                           note="no heartbeat monitor; PG timeout 20 s; TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"),
}
CHOICES = list(VARIANTS)
DEFAULT = [n for n in CHOICES if n != "mbr-launch-nostandby"]
BASE = "ft_launcher-0.5"  # ft_launcher's best case: the ratio that flatters it most


def read_hang(path: Path) -> tuple[float, float, int] | None:
    """(last heartbeat, hang start, pid) from the worker's hang file."""
    try:
        parts = path.read_text().split()
    except FileNotFoundError:
        return None
    if len(parts) >= 5 and parts[0] == "hang":
        return float(parts[2]), float(parts[3]), int(parts[4])
    return None


FT_MISSED = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\] \[\w+\] \[RankMonServer\d+@[^:\]]*:(\d+)\] "
                       r"Did not get subsequent heartbeat")


def ft_detection(stderr: Path, rank: int) -> float | None:
    """Wall time of ft_launcher's 'Did not get subsequent heartbeat' line for rank (local time, ms)."""
    try:
        text = stderr.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        m = FT_MISSED.match(line)
        if m and int(m.group(2)) == rank:
            return datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return None


def blamed_rank(name: str, trial_dir: Path) -> int | None:
    """The rank the launcher first declared hung: mbr-launch's first ``hang`` event, ft_launcher's first
    ``Did not get subsequent heartbeat`` line. Rank 1 is the hung one; rank 0 is blocked in its all_reduce
    and stops heartbeating one step (~50 ms) later, so blaming rank 0 means the monitor checked too late to
    tell them apart."""
    if name.startswith("mbr-launch"):
        hang = next((e for e in h.read_events(trial_dir / "logs") if e["event"] == "hang"), None)
        return None if hang is None else hang.get("rank")
    if name.startswith("ft_launcher"):
        try:
            text = (trial_dir / "launcher.stderr").read_text(errors="replace")
        except OSError:
            return None
        return next((int(m.group(2)) for m in map(FT_MISSED.match, text.splitlines()) if m), None)
    return None


def mbr_breakdown(events: list[dict], ready1: dict[int, h.Ready]) -> dict | None:
    """hang event -> stacks -> hung rank reaped -> all reaped -> rendezvous -> spawned -> ready (seconds)."""
    hang = next((e for e in events if e["event"] == "hang"), None)
    rdzv = next((e for e in events if e["event"] == "rendezvous" and (e.get("round") or 0) >= 1), None)
    if not hang or not rdzv or not ready1:
        return None
    t_hang = h.parse_ts(hang["ts"])
    stacks = next((h.parse_ts(e["ts"]) for e in events if e["event"] == "stacks"), t_hang)
    exits0 = [e for e in events if e["event"] == "worker_exit" and e.get("round") == hang.get("round")]
    t_hung_exit = next((h.parse_ts(e["ts"]) for e in exits0 if e.get("rank") == hang["rank"]), stacks)
    t_all_exit = max([t_hung_exit, *(h.parse_ts(e["ts"]) for e in exits0)])
    starts = [h.parse_ts(e["ts"]) for e in events if e["event"] == "worker_start" and e.get("round") == rdzv["round"]]
    if not starts:
        return None
    return {
        "t_event": t_hang, "elapsed": hang.get("elapsed"),
        "stacks": stacks - t_hang,
        "kill": t_hung_exit - stacks,
        "stop": t_all_exit - t_hung_exit,
        "rendezvous": h.parse_ts(rdzv["ts"]) - t_all_exit,
        "spawn": max(starts) - h.parse_ts(rdzv["ts"]),
        "boot": max(r.time for r in ready1.values()) - max(starts),
        "method": ",".join(next((e.get("method") or [] for e in events if e["event"] == "stacks"), [])) or "none",
    }


def hang_trial(launcher: h.Launcher, root: Path, index: int, *, deadline: float, hang_after: float,
               pg_timeout: float) -> dict:
    def spec(d: Path) -> h.LaunchSpec:
        return h.LaunchSpec(nproc=2, max_restarts=1, log_dir=d / "logs", worker=[
            str(FT_HANG), "--ready-file", str(d / "ready"), "--hang-file", str(d / "hang"), "--hang-after",
            str(hang_after), "--pg-timeout", str(pg_timeout)])

    rec: dict = {"launcher": launcher.name, "trial": index, "ok": False, "reason": ""}
    with h.Trial(launcher, spec, root, index) as t:
        assert t.proc
        state, ready0 = h.wait_ready(t.proc, t.ready_file, restart=0, nproc=2, timeout=deadline)
        if state != "ready":
            rec["reason"] = h.failure_reason(t.proc, f"first start: {state} (rc {t.proc.returncode})")
            return rec
        watch = h.ExitWatch(ready0[1].pid, timeout=deadline + hang_after + 30)
        hang_file = t.dir / "hang"
        end = time.monotonic() + hang_after + 30
        while (hung := read_hang(hang_file)) is None and time.monotonic() < end and t.proc.poll() is None:
            time.sleep(0.01)
        if hung is None:
            rec["reason"] = h.failure_reason(t.proc, f"rank 1 never reported its hang (rc {t.proc.returncode})")
            return rec
        t_hb, t_hang, _pid = hung
        rec.update(t_hb=t_hb, t_hang=t_hang)
        since = t.proc.stderr_size()
        state, ready1 = h.wait_ready(t.proc, t.ready_file, restart=1, nproc=2, timeout=deadline)
        if watch.t_gone is not None:
            rec["gone"] = watch.t_gone - t_hb  # hung pid gone, after its last heartbeat
            rec["detect"] = watch.t_gone - (t_hb + TIMEOUT)  # ... past the timeout
        if state != "ready":
            what = (f"restart-1 ranks not ready {deadline:.0f} s after the hang ({len(ready1)} of 2)"
                    if state == "timeout" else f"launcher exited {t.proc.returncode} before restart 1 was ready")
            rec["reason"] = h.failure_reason(t.proc, what, since=since)
            return rec
        rec["hang_ready"] = max(r.time for r in ready1.values()) - t_hb
        rc = t.proc.wait_exit(deadline)
        rec["rc"] = rc
        if rc == 0:
            rec["ok"] = True
        else:
            rec["reason"] = h.failure_reason(t.proc, f"restarted, then exit code {rc}", since=since)
        if launcher.name.startswith("mbr-launch"):
            bd = mbr_breakdown(h.read_events(t.spec.log_dir), ready1)
            if bd:
                rec["breakdown"] = bd
                rec["detect_own"] = bd["t_event"] - (t_hb + TIMEOUT)
        elif launcher.name.startswith("ft_launcher"):
            t_det = ft_detection(t.proc.stderr_path, 1)
            if t_det is not None:
                rec["detect_own"] = t_det - (t_hb + TIMEOUT)
        rec["blamed"] = blamed_rank(launcher.name, t.dir)
    rec["leftovers"] = t.leftovers
    return rec


# ---- report ---------------------------------------------------------------------------------------------

def render(records: list[dict], names: list[str], args: argparse.Namespace, rpc: str) -> str:
    by = {n: [r for r in records if r["launcher"] == n] for n in names}
    ok = {n: [r for r in by[n] if r["ok"]] for n in names}

    def summ(n: str, key: str) -> h.Summary | None:
        return h.summarize([r[key] for r in ok[n] if r.get(key) is not None])

    rows = []
    for n in names:
        v = VARIANTS[n]
        blamed = [r.get("blamed") for r in ok[n] if r.get("blamed") is not None]
        blame = f"{blamed.count(1)}/{len(blamed)}" if blamed else "-"
        restart = h.summarize([r["hang_ready"] - r["gone"] for r in ok[n] if r.get("gone") is not None])
        rows.append([f"{n} ({v.note})", f"{len(ok[n])}/{len(by[n])}", blame, h.fmt_cell(summ(n, "detect")),
                     h.fmt_cell(summ(n, "detect_own")), h.fmt_cell(summ(n, "gone")), h.fmt_cell(restart),
                     h.fmt_cell(summ(n, "hang_ready")),
                     h.ratio(summ(n, "hang_ready"), summ(BASE, "hang_ready")) if BASE in names else "-"])
    out = [f"## Hang detection: rank 1 of 2 stops heartbeating (timeout {TIMEOUT:g} s) -> restarted ranks ready",
           "", *h.machine_lines(gpu=False, mbr_code=args.mbr_code),
           f"- command: `{getattr(args, 'commands', '') or h.command_line()}`",
           (f"- load average at end {os.getloadavg()[0]:.2f}; worker `benchmarks/workers/ft_hang.py` (NVRx "
           f"RankMonitorClient heartbeat + gloo all_reduce every 50 ms; rank 1 stops before a heartbeat "
           f"{args.hang_after:g} s after it is ready; PG timeout {args.pg_timeout:g} s); flags for both fault-tolerant "
           f"launchers: `--standalone --nproc-per-node 2 --max-restarts 1 {' '.join(TIMEOUT_FLAGS)}`; "
           f"trials interleaved in rotating order; torchrun only in trials whose index is a multiple of {args.torchrun_every}"),
           ("- hang start = the hung rank's last heartbeat (the monitor's clock starts there); deadline = hang start "
           f"+ {TIMEOUT:g} s. *pid gone past the deadline*: the hung rank's exit seen by a pidfd in the bench (the "
           "same yardstick for all). *own record*: mbr-launch's `hang` event `ts`, ft_launcher's `Did not get "
           "subsequent heartbeat` log line (ms resolution). *hung rank 1 blamed first*: trials whose first hang verdict "
           "(mbr-launch `hang` event, ft_launcher log line) named rank 1; rank 0, blocked in the all_reduce, misses "
           "its own deadline one step (~50 ms) later, so a verdict on rank 0 kills the wrong rank. Cells: median "
           "(p25 / p75) over successful trials."), "",
           h.table(["launcher", "ok", "hung rank 1 blamed first", "pid gone past the deadline", "own record past the deadline",
                    "hang -> pid gone", "pid gone -> restarted ready", "hang -> restarted ready",
                    f"ready ratio vs {BASE}"], rows), ""]
    # paired ratios (same trial = same load)
    pairs = []
    for a in [n for n in names if n.startswith("mbr-launch")]:
        for b in [n for n in names if n.startswith("ft_launcher")]:
            pr = h.paired_ratios({r["trial"]: r["hang_ready"] for r in ok[a]},
                                 {r["trial"]: r["hang_ready"] for r in ok[b]})
            if pr:
                pairs.append(f"{a} / {b} {pr.median:.2f}x (p25 {pr.p25:.2f}, p75 {pr.p75:.2f}, {pr.n} pairs)")
    if pairs:
        out += ["Paired per-trial ratios of hang -> restarted ready: " + "; ".join(pairs) + ".", ""]
    for name in [n for n in names if n.startswith("mbr-launch")]:
        bds = [r["breakdown"] for r in ok[name] if r.get("breakdown")]
        if not bds:
            continue
        keys = [("stacks", "hang event -> stacks written"), ("kill", "stacks -> hung rank reaped (SIGTERM)"),
                ("stop", "-> every old rank reaped"), ("rendezvous", "-> next round's rendezvous done"),
                ("spawn", "-> new ranks spawned"), ("boot", "-> restart-1 ranks ready")]
        brows = [[label, h.fmt_cell(h.summarize([b[k] for b in bds]))] for k, label in keys]
        methods = sorted({b["method"] for b in bds})
        out += [f"{name} breakdown from events.jsonl (median (p25 / p75); stack method {', '.join(methods)}):", "",
                h.table(["segment", "seconds"], brows), ""]
    out += h.failure_lines(records)
    if rpc:
        out += [("Reference, client RPC cost (`python benchmarks/bench_monitor_rpc.py`, run once after the main "
                "bench; another owner's script):"), "", rpc.strip(), ""]
    return "\n".join(out)


def run_rpc_bench() -> str:
    try:
        res = subprocess.run([sys.executable, str(h.REPO / "benchmarks" / "bench_monitor_rpc.py")], check=False,
                             capture_output=True, text=True, timeout=300, cwd=h.REPO,
                             env={**os.environ, "PYTHONWARNINGS": "ignore"}, start_new_session=True)
    except subprocess.TimeoutExpired:
        return "(bench_monitor_rpc.py did not finish within 300 s)"
    if res.returncode != 0:
        return f"(bench_monitor_rpc.py failed, exit {res.returncode}: {res.stderr.strip()[-300:]})"
    return res.stdout


def main() -> int:
    parser = h.bench_parser(__doc__, trials=8, choices=CHOICES, default=DEFAULT, gpu=False, nproc=False,
                            from_raw=True)
    parser.add_argument("--torchrun-every", type=int, default=2, help="run torchrun every Nth trial (it is slow)")
    parser.add_argument("--hang-after", type=float, default=2.0)
    parser.add_argument("--pg-timeout", type=float, default=20.0)
    parser.add_argument("--deadline", type=float, default=60.0, help="seconds allowed per phase")
    parser.add_argument("--no-rpc", action="store_true", help="skip the bench_monitor_rpc.py reference")
    parser.add_argument("--logs-root", type=Path, nargs="+", help="with --from-raw: the kept trial dirs of each run")
    parser.add_argument("--rpc-text", type=Path, help="with --from-raw: bench_monitor_rpc.py output to include")
    args = parser.parse_args()
    if args.from_raw:
        return h.render_raw(args, SECTION, lambda records: render_raw(records, args))
    names = h.variant_names(args.launchers, VARIANTS, CHOICES)
    session = h.start(args, "hang")
    launchers = session.with_baseline([h.with_mbr_path(VARIANTS[n], session.mbr_path) for n in names])
    VARIANTS.update({l.name: l for l in launchers})  # the baseline's variants, for the report's notes
    names = [l.name for l in launchers]

    def run(step: h.Step) -> dict | None:
        if step.item.name == "torchrun" and step.trial % max(1, args.torchrun_every):
            return None  # torchrun waits out its PG timeout: only every Nth trial
        return hang_trial(step.item, session.root, step.trial, deadline=args.deadline, hang_after=args.hang_after,
                          pg_timeout=args.pg_timeout)

    def status(rec: dict) -> str:
        return (f"ok detect {rec.get('detect', float('nan')):+.3f} s, own "
                f"{rec.get('detect_own', float('nan')):+.3f} s, ready {rec['hang_ready']:.3f} s")

    done = h.run_trials(args, session, h.plan(launchers, args.trials), run, status, width=18)
    rpc = ""
    if not args.no_rpc and not done.interrupted:
        try:
            rpc = run_rpc_bench()
        except KeyboardInterrupt:
            print("interrupted: reporting the trials so far", file=sys.stderr)
    text = render(done.records, names, args, rpc)
    return h.publish(args, SECTION, text, done.records)


def render_raw(records: list[dict], args: argparse.Namespace) -> str:
    """The report of earlier runs' --raw files; with --logs-root, the blamed rank is read from kept logs."""
    for rec in records:
        k, trial = divmod(rec["trial"], 1000)
        if args.logs_root and rec.get("blamed") is None:
            rec["blamed"] = blamed_rank(rec["launcher"], args.logs_root[k] / f"{trial:03d}-{rec['launcher']}")
    rpc = args.rpc_text.read_text() if args.rpc_text else ""
    return render(records, h.launchers_in(records, CHOICES), args, rpc)


if __name__ == "__main__":
    sys.exit(main())
