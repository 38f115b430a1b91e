"""Many agents on one machine: ``--agents`` (32) launchers, one rank each, in one c10d rendezvous; launch ->
every rank started (the rendezvous round), then SIGKILL one rank -> every rank of the next round started (one
restart round), then every launcher must exit 0.

The workers (workers/scale_worker.py) import no torch and run no collective: each writes its ready line the
moment it runs, so the times are the launchers' own (agent start-up, rendezvous, spawning, noticing a
failure in another agent and re-forming the round). On restart 0 the workers sleep; the victim's agent sees
its worker die, and every other agent has to learn of it through the rendezvous, as on a real cluster.

All on 127.0.0.1: ``--nnodes N --nproc-per-node 1 --max-restarts 1 --rdzv-backend c10d --rdzv-endpoint
127.0.0.1:<free port>``; agent 0 starts first and hosts the store (the others find it bound and join as
clients). Variants interleave per trial. mbr-launch's default warm standby preloads torch in a spare process
per agent, which on a small machine competes with 2N other processes for the CPUs; ``mbr-launch-nostandby``
shows the run without it.

    python benchmarks/bench_scale.py --agents 32 --trials 3 --out benchmarks/RESULTS.md
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness as h  # noqa: E402

SECTION = "bench_scale"
WORKER = h.WORKERS / "scale_worker.py"
FT_HEARTBEATS = ["--ft-initial-rank-heartbeat-timeout", "600", "--ft-rank-heartbeat-timeout", "600"]
# name -> (tool, extra flags, extra env, note)
VARIANTS: dict[str, tuple[str, list[str], dict[str, str], str]] = {
    "mbr-launch": ("mbr-launch", [], {}, "defaults (warm standby: torch)"),
    "mbr-launch-nostandby": ("mbr-launch", ["--standby", "off"], {}, "--standby off"),
    "torchrun": ("torchrun", [], {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"),
    "ft_launcher": ("ft_launcher", FT_HEARTBEATS, {}, "--ft-*-heartbeat-timeout 600"),
}
CHOICES = list(VARIANTS)


def _last_ready(ready: Path, restart: int, n: int, procs: list[h.Proc], deadline: float) -> tuple[str, dict]:
    """Wait until n ranks of `restart` are ready: ('ready'|'exited'|'timeout', ranks seen)."""
    end = time.monotonic() + deadline
    while True:
        seen = h.ready_ranks(ready, restart)
        if len(seen) >= n:
            return "ready", seen
        if any(p.poll() is not None and p.returncode != 0 for p in procs):
            return "exited", seen
        if time.monotonic() >= end:
            return "timeout", seen
        time.sleep(0.02)


def _why(procs: list[h.Proc], what: str) -> str:
    """The failure, with the stderr of the first agent that exited non-zero (else agent 0's)."""
    bad = next((i for i, p in enumerate(procs) if p.returncode not in (None, 0)), 0)
    codes = sorted({p.returncode for p in procs if p.returncode is not None})
    return h.failure_reason(procs[bad], f"{what} (agent {bad} exit code {procs[bad].returncode}; exit codes "
                                        f"seen {codes})")


def scale_trial(name: str, root: Path, index: int, args: argparse.Namespace, mbr_env: dict[str, str]) -> dict:
    tool, extra, env_extra, _note = VARIANTS[name]
    d = root / f"{index:03d}-{name}"
    d.mkdir(parents=True)
    ready, port, token = d / "ready", h.free_port(), uuid.uuid4().hex
    env = h.bench_env(token, {**env_extra, **(mbr_env if tool == "mbr-launch" else {})})
    restarted = d / "restarted"
    worker = [str(WORKER), "--ready-file", str(ready), "--restarted-file", str(restarted), "--hold",
              str(2 * args.deadline + 60)]
    n = args.agents
    rec: dict = {"launcher": name, "trial": index, "ok": False, "reason": ""}
    procs: list[h.Proc] = []
    try:
        t0 = time.time()
        for i in range(n):
            argv = [h.tool(tool), "--nnodes", str(n), "--nproc-per-node", "1", "--max-restarts", "1",
                    "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"s{port}",
                    *extra, *(["--log-dir", str(d / f"logs{i}")] if tool == "mbr-launch" else []), *worker]
            procs.append(h.Proc(argv, env=env, out_dir=d, name=f"agent{i}"))
            if i == 0:
                time.sleep(0.5)  # the store's host first
        state, seen = _last_ready(ready, 0, n, procs, args.deadline)
        if state != "ready":
            rec["reason"] = _why(procs, f"round 0: {state}, {len(seen)} of {n} ranks started")
            return rec
        rec["rendezvous"] = max(r.time for r in seen.values()) - t0
        victim = seen[n - 1]
        restarted.touch()  # workers started from now on are the next round's
        t_kill = time.time()
        os.kill(victim.pid, signal.SIGKILL)
        state, seen1 = _last_ready(ready, 1, n, procs, args.deadline)
        if state != "ready":
            rec["reason"] = _why(procs, f"restart: {state}, {len(seen1)} of {n} ranks started")
            return rec
        rec["restart"] = max(r.time for r in seen1.values()) - t_kill
        rec["restart_first"] = min(r.time for r in seen1.values()) - t_kill
        t_end = time.monotonic() + args.deadline
        codes = [p.wait_exit(max(0.0, t_end - time.monotonic())) for p in procs]
        rec["exit"] = time.time() - t_kill
        rec["codes"] = codes
        rec["ok"] = all(c == 0 for c in codes)
        if not rec["ok"]:
            rec["reason"] = _why(procs, f"exit codes {codes}")
        return rec
    finally:
        for p in procs:
            p.kill_session()
        left = h.kill_marked(token)
        if left:
            rec["leftovers"] = left
        for p in procs:
            p.close()


def render(records: list[dict], names: list[str], args: argparse.Namespace) -> str:
    out = [f"## {args.agents} agents on one machine: rendezvous, and one restart round", "",
           *h.machine_lines(gpu=False, mbr_code=args.mbr_code), f"- command: `{h.command_line()}`",
           f"- load average at end {os.getloadavg()[0]:.2f}; one rank per agent (no torch in the workers); "
           "timings over successful trials only", ""]
    by = {n: [r for r in records if r["launcher"] == n] for n in names}
    keys = ("rendezvous", "restart_first", "restart", "exit")
    stats = {n: {k: h.summarize([r[k] for r in rs if r["ok"]]) for k in keys} for n, rs in by.items()}
    rows = []
    for n, rs in by.items():
        s = stats[n]
        rows.append([f"{n} ({VARIANTS[n][3]})", f"{sum(r['ok'] for r in rs)}/{len(rs)}",
                     *(h.fmt_s(s[k] and s[k].median) for k in ("rendezvous", "restart_first", "restart")),
                     h.fmt_iqr(s["restart"]), h.ratio(s["restart"], stats.get("torchrun", {}).get("restart")),
                     h.fmt_s(s["exit"] and s["exit"].median)])
    out += [h.table(["launcher", "ok", f"launch -> all {args.agents} ranks started", "kill -> first rank restarted",
                     f"kill -> all {args.agents} ranks restarted", "p25 / p75", "restart vs torchrun",
                     "kill -> every launcher exited"], rows), ""]
    out += h.failure_lines(records)
    return "\n".join(out)


def main() -> int:
    parser = h.bench_parser(__doc__, trials=3, choices=CHOICES)
    parser.add_argument("--agents", type=int, default=32)
    parser.add_argument("--deadline", type=float, default=180.0, help="seconds allowed per phase")
    args = parser.parse_args()
    names = h.variant_names(args.launchers, VARIANTS, CHOICES)
    session = h.start(args, "scale")
    mbr_env = h.mbr_env(session.mbr_path)
    done = h.run_trials(args, session, h.plan(names, args.trials),
                        lambda step: scale_trial(step.item, session.root, step.trial, args, mbr_env),
                        lambda r: f"all started {r['rendezvous']:.2f} s, restarted {r['restart']:.2f} s", width=21)
    return h.publish(args, SECTION, render(done.records, names, args), done.records)


if __name__ == "__main__":
    sys.exit(main())
