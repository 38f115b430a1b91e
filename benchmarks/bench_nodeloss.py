"""Node loss with a spare: 3 agents, ``--nnodes 2:2``; SIGKILL the agent of one participating node; measure
kill -> both ranks of the new round ready (the survivor plus the spare).

All on localhost (no network namespaces): 3 agents, ``--nproc-per-node 1``, c10d rendezvous at
127.0.0.1:<free port> hosted by agent 0 (``--rdzv-conf is_host=1``, others ``is_host=0``), ``--max-restarts 3``.
Two agents form the round; the third waits outside it as a spare. The victim is a participating agent other
than agent 0 (killing the store's host is a different failure: the store is lost for everyone). Worker:
workers/collective.py (gloo, ready line after the first all_reduce, then all_reduce every 50 ms).

Variants (interleaved, rotating order):

- mbr-launch ``--peer-timeout 2`` and mbr-launch with the default ``--peer-timeout`` (5): SIGKILL of the
  agent; its workers die with it (parent-death signal).
- torchrun: SIGKILL of the agent only; its worker is orphaned (no parent-death signal) and keeps running.
- torchrun-node: SIGKILL of the agent and of its worker (the node is gone as a whole, as when a machine
  dies), so the survivor's all_reduce fails.

Per trial: wait until both ranks of the first round are ready; t_kill; SIGKILL; wait (<= --deadline) for
ready lines of ranks 0 and 1 written after t_kill by new processes. Also recorded: whether the victim's
worker died, and when (pidfd), which agents form the new round, and every agent's exit code at the end.
mbr-launch's recovery is broken down from the survivor's events.jsonl.

    python benchmarks/bench_nodeloss.py --trials 5 --out benchmarks/RESULTS.md
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

import harness as h

SECTION = "bench_nodeloss"
NNODES = "2:2"
AGENTS = 3


def _mbr(*extra: str):
    def argv(flags: list[str], log_dir: Path) -> list[str]:
        return [h.tool("mbr-launch"), *flags, "--log-dir", str(log_dir), *extra]
    return argv


def _torchrun(flags: list[str], _log_dir: Path) -> list[str]:
    return [h.tool("torchrun"), *flags]


NOSHARE = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
# name -> (argv builder, kill the victim's workers too, note, extra env)
VARIANTS: dict[str, tuple] = {
    "mbr-launch": (_mbr("--peer-timeout", "2"), False, "--peer-timeout 2; SIGKILL agent", {}),
    "mbr-launch-pt5": (_mbr("--peer-timeout", "5"), False, "--peer-timeout 5; SIGKILL agent", {}),
    "torchrun": (_torchrun, False, "SIGKILL agent (its worker is orphaned)", {}),
    "torchrun-node": (_torchrun, True, "SIGKILL agent and its worker (whole node gone)", {}),
    "torchrun-noshare": (_torchrun, False, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1; SIGKILL agent", NOSHARE),
    "torchrun-noshare-node": (_torchrun, True, ("TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1; SIGKILL agent and its "
                              "worker"), NOSHARE),
}
CHOICES = list(VARIANTS)
DEFAULT = CHOICES[:4]


def ppid(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def agent_of(pid: int, agents: list[int]) -> int | None:
    """Index of the agent (launcher process) that pid descends from."""
    for _ in range(10):
        if pid in agents:
            return agents.index(pid)
        nxt = ppid(pid)
        if not nxt or nxt <= 1:
            return None
        pid = nxt
    return None


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def nodeloss_trial(name: str, root: Path, index: int, *, deadline: float, mbr_env: dict[str, str]) -> dict:
    build, kill_workers, _note, extra_env = VARIANTS[name]
    d = root / f"{index:03d}-{name}"
    d.mkdir(parents=True)
    ready = d / "ready"
    port = h.free_port()
    token = uuid.uuid4().hex
    # torchrun logs at INFO so that its rendezvous steps show in the kept logs (no change in behaviour)
    env = h.bench_env(token, mbr_env if name.startswith("mbr") else {"LOGLEVEL": "INFO", **extra_env})
    worker = h.worker_argv(ready, hold=deadline + 120, gpu=False)
    rec: dict = {"launcher": name, "trial": index, "ok": False, "reason": "", "latency": None}
    procs: list[h.Proc] = []
    try:
        for i in range(AGENTS):
            common = ["--nnodes", NNODES, "--nproc-per-node", "1", "--max-restarts", "3", "--rdzv-backend", "c10d",
                      "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"nl{port}", "--rdzv-conf",
                      f"is_host={1 if i == 0 else 0}"]
            procs.append(h.Proc([*build(common, d / f"logs{i}"), *worker], env=env, out_dir=d, name=f"agent{i}"))
            time.sleep(0.3)  # the host first, so that the others find its store
        agents = [p.popen.pid for p in procs]
        t0 = time.monotonic()
        while time.monotonic() - t0 < deadline:
            seen = h.ready_ranks(ready, 0)
            if len(seen) >= 2 or any(p.poll() is not None for p in procs):
                break
            time.sleep(0.02)
        seen = {r.rank: r for r in h.read_ready(ready)}
        if len(seen) < 2:
            rec["reason"] = "first round never ready: " + "; ".join(
                h.failure_reason(p, f"agent {i} rc {p.returncode}") for i, p in enumerate(procs))
            return rec
        where = {rank: agent_of(r.pid, agents) for rank, r in seen.items()}
        participants = sorted(a for a in where.values() if a is not None)
        candidates = [rank for rank, a in where.items() if a not in (None, 0)]
        if len(participants) < 2 or not candidates:
            rec["reason"] = f"could not map ranks to agents: {where}"
            return rec
        victim_rank = max(candidates)
        victim = where[victim_rank]
        spare = next(i for i in range(AGENTS) if i not in participants)
        victim_worker = seen[victim_rank].pid
        rec.update(victim=victim, spare=spare, round0={r: where[r] for r in sorted(where)})
        watch = h.ExitWatch(victim_worker, timeout=deadline + 5)
        old_pids = {r.pid for r in seen.values()}
        since = {i: p.stderr_size() for i, p in enumerate(procs)}
        t_kill = rec["t_kill"] = time.time()
        os.kill(agents[victim], signal.SIGKILL)
        if kill_workers:
            try:
                os.killpg(os.getpgid(victim_worker), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        end = time.monotonic() + deadline
        new: dict[int, h.Ready] = {}
        while time.monotonic() < end:
            new = {r.rank: r for r in h.read_ready(ready) if r.time > t_kill and r.pid not in old_pids}
            live = [p for i, p in enumerate(procs) if i != victim and p.poll() is None]
            if len(new) >= 2 or not live:
                break
            time.sleep(0.01)
        rec["victim_worker_gone"] = None if watch.t_gone is None else watch.t_gone - t_kill
        rec["victim_worker_alive"] = alive(victim_worker)
        rec["new_agents"] = {r: agent_of(x.pid, agents) for r, x in new.items()}
        if len(new) >= 2:
            rec["ok"] = True
            rec["latency"] = max(r.time for r in new.values()) - t_kill
            rec["spare_in"] = spare in rec["new_agents"].values()
        else:
            survivors = [i for i in range(AGENTS) if i != victim]
            rec["reason"] = (f"no new round ready {deadline:.0f} s after the kill ({len(new)} of 2 ranks); "
                             f"victim's worker {'still alive (orphaned)' if rec['victim_worker_alive'] else 'gone'}; "
                             + "; ".join(h.failure_reason(procs[i], f"agent {i}"
                                                          f"{' (spare)' if i == spare else ''} "
                                                          f"{'running' if procs[i].poll() is None else f'exited {procs[i].returncode}'}",
                                                          since=since[i]) for i in survivors))
        rec["rcs"] = {i: p.poll() for i, p in enumerate(procs)}
        if name.startswith("mbr"):
            survivor = next((i for i in range(AGENTS) if i not in (victim, spare)), None)
            if survivor is not None:
                rec["breakdown"] = breakdown(h.read_events(d / f"logs{survivor}"), t_kill, new)
        return rec
    finally:
        for p in procs:
            p.kill_session()  # SIGKILL each agent's session: its workers, in sessions of their own, stay
        time.sleep(1.0)
        rec["leftovers"] = len(h.marked_pids(token))  # processes that outlived their agent by 1 s: orphans
        h.kill_marked(token)
        for p in procs:
            p.close()


def breakdown(events: list[dict], t_kill: float, new: dict[int, h.Ready]) -> dict | None:
    lost = next((e for e in events if e["event"] in ("peer_lost", "failure") and e.get("round") == 0), None)
    rdzv = next((e for e in events if e["event"] == "rendezvous" and (e.get("round") or 0) >= 1), None)
    if not lost or not rdzv or len(new) < 2:
        return None
    t_lost = h.parse_ts(lost["ts"])
    exits = [h.parse_ts(e["ts"]) for e in events if e["event"] == "worker_exit" and e.get("round") == 0]
    t_stopped = max([t_lost, *exits])
    starts = [h.parse_ts(e["ts"]) for e in events if e["event"] == "worker_start" and e.get("round") == rdzv["round"]]
    return {
        "detect": t_lost - t_kill,
        "stop": t_stopped - t_lost,
        "rendezvous": h.parse_ts(rdzv["ts"]) - t_stopped,
        "spawn": (max(starts) - h.parse_ts(rdzv["ts"])) if starts else None,
        "boot": (max(r.time for r in new.values()) - max(starts)) if starts else None,
        "first": f"{lost['event']} {lost.get('kind') or lost.get('cause') or ''}".strip(),
        "restart_count": rdzv.get("restart_count"),
    }


def render(records: list[dict], names: list[str], args: argparse.Namespace) -> str:
    by = {n: [r for r in records if r["launcher"] == n] for n in names}
    lat = {n: h.summarize([r["latency"] for r in by[n] if r["ok"]]) for n in names}
    rows = []
    for n in names:
        okn = sum(r["ok"] for r in by[n])
        spare_in = sum(bool(r.get("spare_in")) for r in by[n] if r["ok"])
        orphans = sum(bool(r.get("victim_worker_alive")) for r in by[n])
        gone = h.summarize([r["victim_worker_gone"] for r in by[n] if r.get("victim_worker_gone") is not None])
        rows.append([f"{n} ({VARIANTS[n][2]})", f"{okn}/{len(by[n])}", h.fmt_s(lat[n] and lat[n].median),
                     h.fmt_iqr(lat[n]), h.ratio(lat[n], lat.get("mbr-launch")), f"{spare_in}/{okn}",
                     f"{orphans}/{len(by[n])}" + (f"; else gone after {gone.median:.3f} s" if gone else "")])
    out = [(f"## Node loss with a spare: 3 agents, --nnodes {NNODES}, SIGKILL one participating agent -> "
           "new round ready"), "",
           *h.machine_lines(gpu=False, mbr_code=args.mbr_code),
           f"- command: `{getattr(args, 'commands', '') or h.command_line()}`",
           (f"- load average at end {os.getloadavg()[0]:.2f}; localhost, no network namespaces (the agent is "
           "SIGKILLed, the network stays up); agents: `--nnodes 2:2 --nproc-per-node 1 --max-restarts 3 "
           "--rdzv-backend c10d --rdzv-endpoint 127.0.0.1:<free port> --rdzv-conf is_host=1|0` (agent 0 hosts "
           "the store and is never the victim); worker `benchmarks/workers/collective.py`; torchrun with `LOGLEVEL=INFO`; deadline "
           f"{args.deadline:.0f} s after the kill; trials interleaved in rotating order"), "",
           h.table(["launcher", "recovered", "kill -> new round ready (median)", "p25 / p75",
                    "ratio vs mbr-launch", "spare in the new round", "victim's worker still alive at the end"],
                   rows), ""]
    for n in [n for n in names if n.startswith("mbr")]:
        bds = [r["breakdown"] for r in by[n] if r["ok"] and r.get("breakdown")]
        if not bds:
            continue
        keys = [("detect", "kill -> survivor's first failure or peer_lost event"), ("stop", "-> survivor's old worker reaped"),
                ("rendezvous", "-> new round's rendezvous done (survivor + spare)"),
                ("spawn", "-> new worker spawned (standby)"), ("boot", "-> both new ranks ready")]
        brows = [[label, h.fmt_cell(h.summarize([b[k] for b in bds if b.get(k) is not None]))] for k, label in keys]
        firsts = sorted({b["first"] for b in bds})
        rcs = sorted({str(b.get("restart_count")) for b in bds})
        out += [(f"{n} breakdown from the survivor's events.jsonl (median (p25 / p75); first event: "
                f"{', '.join(firsts)}; TORCHELASTIC_RESTART_COUNT of the new round: {', '.join(rcs)}):"), "",
                h.table(["segment", "seconds"], brows), ""]
    out += h.failure_lines(records, heading="Trials that did not recover:", limit=600, leftovers=(
        "Processes alive 1 s after the bench SIGKILLed every agent's session at the end of the trial (workers "
        "in sessions of their own that outlived their agent: orphans), then killed by their env tag: "))
    return "\n".join(out)


def main() -> int:
    parser = h.bench_parser(__doc__, trials=5, choices=CHOICES, default=DEFAULT, gpu=False, nproc=False,
                            from_raw=True)
    parser.add_argument("--deadline", type=float, default=40.0, help="seconds allowed per phase")
    args = parser.parse_args()
    if args.from_raw:
        return h.render_raw(args, SECTION, lambda records: render(records, h.launchers_in(records, CHOICES), args))
    names = h.variant_names(args.launchers, VARIANTS, CHOICES)
    session = h.start(args, "nodeloss")
    mbr_env = h.mbr_env(session.mbr_path)

    def status(rec: dict) -> str:
        return (f"ok {rec['latency']:.3f} s (new round on agents {sorted(set(rec['new_agents'].values()))}, "
                f"victim {rec['victim']}, spare {rec['spare']})")

    done = h.run_trials(args, session, h.plan(names, args.trials),
                        lambda step: nodeloss_trial(step.item, session.root, step.trial, deadline=args.deadline,
                                                    mbr_env=mbr_env),
                        status, width=15, failed=lambda r: f"NOT RECOVERED: {r['reason'][:300]}")
    text = render(done.records, names, args)
    return h.publish(args, SECTION, text, done.records)


if __name__ == "__main__":
    sys.exit(main())
