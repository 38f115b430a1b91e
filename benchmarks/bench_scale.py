"""Many agents on one machine: ``--agents`` (32; a comma list runs each count in turn) launchers, one rank each, in one c10d rendezvous; launch ->
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
    python benchmarks/bench_scale.py --agents 64,128,256 --trials 1 --launchers mbr-launch,torchrun --count-store

``--count-store`` runs each launcher through harness/storecount.py, which counts every rendezvous-store call
the agents make (op names, estimated bytes); the report then gives, per launcher and N, the store operations
and bytes of the launch (start -> all ranks started), of one second of a running round, and of the restart
round (kill -> all restarted), in total (= what the store's host serves) and per agent.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness as h  # noqa: E402
from harness import storecount  # noqa: E402

SECTION = "bench_scale"
WORKER = h.WORKERS / "scale_worker.py"
FT_HEARTBEATS = ["--ft-initial-rank-heartbeat-timeout", "600", "--ft-rank-heartbeat-timeout", "600"]
SECRET_FILE = Path(tempfile.gettempdir()) / f"mbr-bench-secret-{os.getuid()}"  # written by main(), mode 600
# name -> (tool, extra flags, extra env, note)
VARIANTS: dict[str, tuple[str, list[str], dict[str, str], str]] = {
    "mbr-launch": ("mbr-launch", [], {}, "defaults (warm standby: torch)"),
    "mbr-launch-nostandby": ("mbr-launch", ["--standby", "off"], {}, "--standby off"),
    # every store value sealed and verified (issue #29): the secret's cost on the rendezvous and the restart
    "mbr-launch-secret": ("mbr-launch", [], {"MBR_RDZV_SECRET_FILE": str(SECRET_FILE)}, "--rdzv-secret-file"),
    "torchrun": ("torchrun", [], {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"),
    "ft_launcher": ("ft_launcher", FT_HEARTBEATS, {}, "--ft-*-heartbeat-timeout 600"),
}
CHOICES = list(VARIANTS)
MODULES = {"mbr-launch": "mbr_launch", "torchrun": "torch.distributed.run"}  # what --count-store runs
COUNTER = Path(storecount.__file__)


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


def _command(tool: str, counted: bool) -> list[str]:
    if counted and tool in MODULES:
        return [sys.executable, str(COUNTER), MODULES[tool]]
    return [h.tool(tool)]


def _store_windows(rec: dict, d: Path, n: int, t0: float, t_ready: float, t_kill: float, t_restarted: float) -> None:
    """The store traffic of the launch, of the running round (per second) and of the restart round."""
    series = [s for i in range(n) for s in storecount.load(str(d / "store" / f"agent{i}"))]
    steady = max(0.5, t_kill - t_ready - 1.0)
    rec["store"] = {"launch": storecount.window(series, t0, t_ready),
                    "running_per_s": storecount.window(series, t_ready + 0.5, t_ready + 0.5 + steady),
                    "running_seconds": steady,
                    "restart": storecount.window(series, t_kill, t_restarted)}


def _join_seconds(d: Path, n: int) -> dict[str, list[float]]:
    """Per round, every agent's time inside the rendezvous join (its events' ``rendezvous.seconds``)."""
    joins: dict[str, list[float]] = {}
    for i in range(n):
        for e in h.read_events(d / f"logs{i}"):
            if e.get("event") == "rendezvous":
                joins.setdefault(str(e.get("round")), []).append(float(e.get("seconds") or 0.0))
    return {k: sorted(v) for k, v in joins.items()}


def scale_trial(name: str, root: Path, index: int, args: argparse.Namespace, mbr_env: dict[str, str],
                n: int) -> dict:
    tool, extra, env_extra, _note = VARIANTS[name]
    d = root / f"{n:04d}-{index:03d}-{name}"
    d.mkdir(parents=True)
    ready, port, token = d / "ready", h.free_port(), uuid.uuid4().hex
    env = h.bench_env(token, {**env_extra, **(mbr_env if tool == "mbr-launch" else {})})
    restarted = d / "restarted"
    worker = [str(WORKER), "--ready-file", str(ready), "--restarted-file", str(restarted), "--hold",
              str(2 * args.deadline + 60)]
    counted = args.count_store and tool in MODULES
    rec: dict = {"launcher": name, "trial": index, "agents": n, "ok": False, "reason": ""}
    procs: list[h.Proc] = []
    try:
        t0 = time.time()
        for i in range(n):
            argv = [*_command(tool, counted), "--nnodes", str(n), "--nproc-per-node", "1", "--max-restarts", "1",
                    "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"s{port}",
                    *extra, *(["--log-dir", str(d / f"logs{i}")] if tool == "mbr-launch" else []), *worker]
            agent_env = {**env, "MBR_STORECOUNT_DIR": str(d / "store" / f"agent{i}")} if counted else env
            procs.append(h.Proc(argv, env=agent_env, out_dir=d, name=f"agent{i}"))
            if i == 0:
                time.sleep(0.5)  # the store's host first
        state, seen = _last_ready(ready, 0, n, procs, args.deadline)
        if state != "ready":
            rec["reason"] = h.first_failed(procs, f"round 0: {state}, {len(seen)} of {n} ranks started")
            return rec
        rec["rendezvous"] = max(r.time for r in seen.values()) - t0
        victim = seen[n - 1]
        time.sleep(args.steady)  # a running round's own store traffic (the peer watch, keep-alives)
        restarted.touch()  # workers started from now on are the next round's
        t_kill = time.time()
        os.kill(victim.pid, signal.SIGKILL)
        state, seen1 = _last_ready(ready, 1, n, procs, args.deadline)
        if state != "ready":
            rec["reason"] = h.first_failed(procs, f"restart: {state}, {len(seen1)} of {n} ranks started")
            return rec
        rec["restart"] = max(r.time for r in seen1.values()) - t_kill
        rec["restart_first"] = min(r.time for r in seen1.values()) - t_kill
        if counted:
            time.sleep(storecount.PERIOD * 2)  # the last snapshots
            _store_windows(rec, d, n, t0, t0 + rec["rendezvous"], t_kill, t_kill + rec["restart"])
        t_end = time.monotonic() + args.deadline
        codes = [p.wait_exit(max(0.0, t_end - time.monotonic())) for p in procs]
        rec["exit"] = time.time() - t_kill
        if tool == "mbr-launch":
            rec["joins"] = _join_seconds(d, n)
        rec["codes"] = codes
        rec["ok"] = all(c == 0 for c in codes)
        if not rec["ok"]:
            rec["reason"] = h.first_failed(procs, f"exit codes {codes}")
        return rec
    finally:
        h.end_agents(procs, token, rec)


def _table(records: list[dict], names: list[str], n: int) -> list[str]:
    by = {name: [r for r in records if r["launcher"] == name and r.get("agents", n) == n] for name in names}
    keys = ("rendezvous", "restart_first", "restart", "exit")
    stats = {k: {key: h.summarize([r[key] for r in rs if r["ok"]]) for key in keys} for k, rs in by.items()}
    rows = []
    for name, rs in by.items():
        if not rs:
            continue
        s = stats[name]
        torchrun = stats.get("torchrun", {})
        rows.append([f"{name} ({VARIANTS[name][3]})", f"{sum(r['ok'] for r in rs)}/{len(rs)}",
                     h.fmt_s(s["rendezvous"] and s["rendezvous"].median), h.ratio(s["rendezvous"], torchrun.get("rendezvous")),
                     *(h.fmt_s(s[k] and s[k].median) for k in ("restart_first", "restart")),
                     h.ratio(s["restart"], torchrun.get("restart")), h.fmt_s(s["exit"] and s["exit"].median)])
    return [f"### {n} agents", "", h.table(["launcher", "ok (every agent exit 0)", f"launch -> all {n} ranks started",
                                            "launch vs torchrun", "kill -> first rank restarted",
                                            f"kill -> all {n} ranks restarted", "restart vs torchrun",
                                            "kill -> every launcher exited"], rows), ""]


def _store_table(records: list[dict]) -> list[str]:
    rows = []
    for r in records:
        st = r.get("store")
        if not st:
            continue
        n, run = r["agents"], st["running_per_s"]
        per_s = 1.0 / st["running_seconds"]
        cells = [r["launcher"], str(n)]
        for w, scale in ((st["launch"], 1.0), (run, per_s), (st["restart"], 1.0)):
            cells += [f"{w['total_ops'] * scale:,.0f}", f"{w['total_ops'] * scale / n:.1f}",
                      f"{w['bytes'] * scale / 1e6:.2f}"]
        top = sorted(st["restart"]["ops"].items(), key=lambda kv: -kv[1])[:4]
        cells.append(", ".join(f"{k} {v}" for k, v in top if v))
        rows.append(cells)
    if not rows:
        return []
    return ["### Rendezvous-store traffic (`--count-store`: every store call the agents made, summed over agents = "
            "what the store's host serves; bytes = keys and values plus framing, an estimate)", "",
            h.table(["launcher", "N", "launch: ops", "ops/agent", "MB", "running, per s: ops", "ops/agent", "MB",
                     "restart round: ops", "ops/agent", "MB", "restart round's ops by kind"], rows), ""]


def render(records: list[dict], names: list[str], args: argparse.Namespace) -> str:
    counts = sorted({r.get("agents", 0) for r in records}) or args.agent_counts
    title = ", ".join(str(n) for n in counts)
    out = [f"## {title} agents on one machine: rendezvous, and one restart round", "",
           *h.machine_lines(gpu=False, mbr_code=args.mbr_code), f"- command: `{h.command_line()}`",
           f"- load average at end {os.getloadavg()[0]:.2f}; one rank per agent (no torch in the workers); "
           "timings over successful trials only", ""]
    for n in counts:
        out += _table(records, names, n)
    out += _store_table(records)
    joins = [f"- {r['launcher']}, {r['agents']} agents, trial {r['trial']}: round {k}: min {v[0]:.2f} s, median "
             f"{v[len(v) // 2]:.2f} s, max {v[-1]:.2f} s" for r in records if r.get("joins")
             for k, v in sorted(r["joins"].items()) if v]
    if joins:
        out += ["Time each agent spent inside the rendezvous join (its events' `rendezvous.seconds`):", "", *joins, ""]
    out += h.failure_lines(records)
    return "\n".join(out)


def main() -> int:
    parser = h.bench_parser(__doc__, trials=3, choices=CHOICES)
    parser.add_argument("--agents", default="32", help="agents per job; a comma list runs each count in turn")
    parser.add_argument("--deadline", type=float, default=180.0, help="seconds allowed per phase")
    parser.add_argument("--steady", type=float, default=0.0, help="seconds between all started and the kill")
    parser.add_argument("--count-store", action="store_true", help="count the agents' store calls (see above)")
    args = parser.parse_args()
    SECRET_FILE.unlink(missing_ok=True)
    SECRET_FILE.touch(mode=0o600)
    SECRET_FILE.write_text(uuid.uuid4().hex + uuid.uuid4().hex)
    args.agent_counts = [int(a) for a in str(args.agents).split(",")]
    names = h.variant_names(args.launchers, VARIANTS, CHOICES)
    session = h.start(args, "scale")
    envs = {name: h.mbr_env(session.mbr_path) for name in names}
    if session.baseline:  # --mbr-baseline REV: every mbr-launch variant again on REV's code, same trials
        path, rev = session.baseline
        for name in [n for n in names if VARIANTS[n][0] == "mbr-launch"]:
            tool, extra, env_extra, note = VARIANTS[name]
            VARIANTS[f"{name}@{rev}"] = (tool, extra, env_extra, f"{note}; code of {rev}")
            names.append(f"{name}@{rev}")
            envs[f"{name}@{rev}"] = h.mbr_env(path)
    steps = [step for n in args.agent_counts for step in h.plan(names, args.trials, phases=(str(n),))]
    done = h.run_trials(args, session, steps,
                        lambda step: scale_trial(step.item, session.root, step.trial, args, envs[step.item],
                                                 int(step.phase)),
                        lambda r: f"{r['agents']} agents: all started {r['rendezvous']:.2f} s, restarted "
                                  f"{r['restart']:.2f} s", width=21)
    return h.publish(args, SECTION, render(done.records, names, args), done.records)


if __name__ == "__main__":
    sys.exit(main())
