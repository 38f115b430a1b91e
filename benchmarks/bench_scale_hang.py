"""A hang among many agents (issue #31): ``--agents`` (32) mbr-launch agents of one rank each on this machine, in
one c10d rendezvous; every rank steps (an optimizer step for the zero-code heartbeat, a gloo all_reduce), then
one rank hangs between two steps while every other rank waits for it in its next all_reduce:

- ``sleep``: the victim sleeps (outside any collective);
- ``sigstop``: the harness SIGSTOPs the victim;
- ``host``: the victim is the rank of the agent that hosts the rendezvous store, SIGSTOPped.

Every agent starts at once (``--stagger`` starts the first one that much earlier, so that it hosts the store).

One launch lives through ``--hangs`` hangs, one per round (the scenarios in turn): 32 torch workers and their
standbys take minutes to start on 2 cores, a restart under a second. Per hang: the verdict must name the victim
on every agent and every rank of the next round must start; per launch: every agent must exit 0 at the end. Reported: how many trials met all of it, hang -> verdict on the last agent
to record it (the target: ``--step-timeout`` + 2 s), the inquiry's own seconds (the ``verdict`` event's
``seconds``: gathering, publishing, deciding), hang -> every rank restarted, and with ``--count-store`` the
store operations and bytes per agent from the hang to the verdict (harness/storecount.py).

    python benchmarks/bench_scale_hang.py --agents 32 --hangs 30 --out benchmarks/RESULTS.md   # 10 of each
    python benchmarks/bench_scale_hang.py --agents 8 --hangs 3 --count-store   # a quick look
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
from harness import storecount  # noqa: E402
from harness.machine import run_quiet  # noqa: E402
from harness.reports import finish_dir, work_dir  # noqa: E402
from testkit.helpers import listener  # noqa: E402  (harness put the repository on sys.path)

SECTION = "bench_scale_hang"
WORKER = h.REPO / "tests" / "scripts" / "many_agents_worker.py"  # shared with tests/test_many_agents.py
SCENARIOS = ("sleep", "sigstop", "host")
COUNTER = Path(storecount.__file__)


def _ranks(path: Path, word: str, generation: int) -> dict[int, tuple[float, int]]:
    """rank -> (time, pid) of the worker lines ``word <rank> <generation> <time> <pid>``."""
    out: dict[int, tuple[float, int]] = {}
    try:
        text = path.read_text()
    except FileNotFoundError:
        return out
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 5 and parts[0] == word and int(parts[2]) == generation:
            out[int(parts[1])] = (float(parts[3]), int(parts[4]))
    return out


def _wait(pred, procs: list[h.Proc], deadline: float) -> str:
    end = time.monotonic() + deadline
    while True:
        if pred():
            return "ok"
        if any(p.poll() is not None and p.returncode != 0 for p in procs):
            return "an agent exited"
        if time.monotonic() >= end:
            return "timeout"
        time.sleep(0.05)


def _parent_chain(pid: int) -> list[int]:
    chain = []
    for _ in range(16):
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        chain.append(pid)
        if pid <= 1:
            break
    return chain


def _rank_of_agent(ready: dict[int, tuple[float, int]], agent_pid: int) -> int | None:
    return next((rank for rank, (_t, pid) in ready.items() if agent_pid in _parent_chain(pid)), None)


def _verdicts_between(d: Path, n: int, start: float, end: float) -> list[dict | None]:
    """Each agent's first verdict event recorded between ``start`` and ``end`` (wall clock)."""
    out: list[dict | None] = []
    for i in range(n):
        found = [e for e in h.read_events(d / f"logs{i}") if e.get("event") == "verdict"
                 and start <= h.parse_ts(e["ts"]) < end]
        out.append(found[0] if found else None)
    return out


def _events_between(d: Path, agent: int, start: float, end: float, limit: int = 12) -> list[str]:
    """The names of one agent's events between ``start`` and ``end``: what it did instead of a verdict."""
    return [str(e.get("event")) for e in h.read_events(d / f"logs{agent}")
            if start <= h.parse_ts(e["ts"]) < end][:limit]


def _phases(d: Path, n: int, t0: float) -> str:
    """How far the launch got, from the agents' own events: per phase of round 0, how many agents reached it and
    when the median and the last one did (seconds after the first agent was started)."""
    seen: dict[str, list[float]] = {"start": [], "rendezvous": [], "worker_start": [], "first_step": []}
    for i in range(n):
        first: dict[str, float] = {}
        for e in h.read_events(d / f"logs{i}"):
            name = str(e.get("event"))
            if name in seen and e.get("round", 0) == 0 and name not in first:
                first[name] = h.parse_ts(e["ts"]) - t0
        for name, t in first.items():
            seen[name].append(t)
    ready = sorted(t - t0 for t, _ in _ranks(d / "ready", "ready", 0).values())
    parts = [f"{name} {len(ts)}/{n}" + (f" (median {sorted(ts)[len(ts) // 2]:.0f} s, last {max(ts):.0f} s)" if ts
                                          else "") for name, ts in [*seen.items(), ("ready", ready)]]
    return "; ".join(parts)


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def launch(plan: list[str], root: Path, index: int, args: argparse.Namespace) -> tuple[dict, list[dict]]:
    """One launch of ``args.agents`` agents that lives through ``len(plan)`` hangs, one per round, then ends:
    the launch's record and one record per hang."""
    n, k = args.agents, len(plan)
    d = root / f"{index:03d}"
    d.mkdir(parents=True)
    ready, gen_file, sleep_dir = d / "ready", d / "generation", d / "sleep"
    sleep_dir.mkdir()
    gen_file.write_text("0")
    port, token = h.free_port(), uuid.uuid4().hex
    env = h.bench_env(token, h.mbr_env(args.mbr_path))  # cwd: the trial's (h.Proc), so -m finds that code
    rec: dict = {"launch": index, "agents": n, "hangs": k, "ok": False, "reason": ""}
    hangs: list[dict] = []
    procs: list[h.Proc] = []
    t0 = time.time()
    try:
        for i in range(n):
            common = ["--nnodes", str(n), "--nproc-per-node", "1", "--max-restarts", str(k), "--rdzv-backend", "c10d",
                      "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"h{port}"]
            script = [str(WORKER), "--ready-file", str(ready), "--gen-file", str(gen_file), "--sleep-dir",
                      str(sleep_dir), "--final", str(k)]
            if args.launcher == "torchrun":  # the launch alone (--hangs 0): torchrun names no hang
                argv = [sys.executable, "-m", "torch.distributed.run", *common, *script]
            else:
                head = [sys.executable, str(COUNTER), "mbr_launch"] if args.count_store else \
                    [sys.executable, "-m", "mbr_launch"] if args.mbr_path else [h.tool("mbr-launch")]
                argv = [*head, *common, "--step-timeout", str(args.step_timeout), "--status", "off", "--standby",
                        args.standby, "--skip-check", "all", "--log-dir", str(d / f"logs{i}"), *script]
            agent_env = {**env, "MBR_STORECOUNT_DIR": str(d / "store" / f"agent{i}")} if args.count_store else env
            procs.append(h.Proc(argv, env=agent_env, out_dir=d, name=f"agent{i}"))
            if i == 0 and args.stagger:
                time.sleep(args.stagger)  # the store's host first (a user's srun or script does not wait)
        state = _wait(lambda: len(_ranks(ready, "ready", 0)) >= n, procs, args.deadline)
        if state != "ok":
            started = len(_ranks(ready, "ready", 0))
            rec["reason"] = h.first_failed(procs, f"round 0: {state}, {started} of {n} ranks started")
            rec["phases"] = _phases(d, n, t0)
            rec["reason"] += f"; phases: {rec['phases']}"
            return rec, hangs
        rec["started"] = max(t for t, _ in _ranks(ready, "ready", 0).values()) - t0
        rec["phases"] = _phases(d, n, t0)
        print(f"  launch {index + 1}: every rank started {rec['started']:.1f} s after the first agent; "
              f"{rec['phases']}", flush=True)
        for g, scenario in enumerate(plan):
            hang: dict = {"launch": index, "hang": g, "scenario": scenario, "agents": n, "ok": False, "reason": ""}
            hangs.append(hang)
            up = _ranks(ready, "ready", g)
            host = listener(port, [p.popen.pid for p in procs]) if scenario == "host" else None
            victim = (_rank_of_agent(up, host) if host else None) if scenario == "host" else args.victim % n
            if victim is None:
                hang["reason"] = "the store host's rank was not found"
                return rec, hangs
            hang["victim"] = victim
            time.sleep(args.steady)
            gen_file.write_text(str(g + 1))  # workers started from now on are the next round's
            if scenario == "sleep":
                tmp = sleep_dir / f".sleep.{g}"
                tmp.write_text(str(victim))
                tmp.rename(sleep_dir / f"sleep.{g}")
                state = _wait(lambda: victim in _ranks(ready, "sleeping", g), procs, 30)
                if state != "ok":
                    hang["reason"] = f"the victim did not sleep: {state}"
                    return rec, hangs
                t_hang = _ranks(ready, "sleeping", g)[victim][0]
            else:
                t_hang = time.time()
                os.kill(up[victim][1], signal.SIGSTOP)
            state = _wait(lambda: len(_ranks(ready, "ready", g + 1)) >= n, procs, args.deadline)
            t_next = time.time()
            verdicts = _verdicts_between(d, n, t_hang, t_next)
            hang["named_by"] = sum(1 for v in verdicts if v and v.get("culprits") == [victim])
            seen = [h.parse_ts(v["ts"]) - t_hang for v in verdicts if v]
            hang["verdict_last"] = max(seen) if seen else None
            hang["inquiry_seconds"] = max((float(v.get("seconds") or 0) for v in verdicts if v), default=None)
            hang["bases"] = sorted({str(v.get("basis")) for v in verdicts if v})
            if args.count_store and seen:
                series = [s for i in range(n) for s in storecount.load(str(d / "store" / f"agent{i}"))]
                hang["store"] = storecount.window(series, t_hang, t_hang + max(seen))
            if state != "ok":
                hang["reason"] = h.first_failed(procs, f"restart: {state}, {len(_ranks(ready, 'ready', g + 1))} of "
                                                f"{n} ranks restarted; named by {hang['named_by']} of {n}")
                return rec, hangs
            hang["restart"] = max(t for t, _ in _ranks(ready, "ready", g + 1).values()) - t_hang
            hang["ok"] = hang["named_by"] == n
            if not hang["ok"]:
                # A missing verdict is a result: what each agent that did not name the victim said and did.
                hang["said"] = {i: (v.get("culprits") if v else None) for i, v in enumerate(verdicts)
                                if not v or v.get("culprits") != [victim]}
                hang["events"] = {i: _events_between(d, i, t_hang, t_next) for i in list(hang["said"])[:4]}
                hang["reason"] = (f"named by {hang['named_by']} of {n}; bases {hang['bases']}; the others said "
                                  f"{dict(list(hang['said'].items())[:8])}; their events {hang['events']}")
            print(f"  hang {g + 1}/{k} {scenario:8s} victim {victim}: ok={hang['ok']} "
                  f"verdict_last={_num(hang['verdict_last'])} inquiry={hang['inquiry_seconds']} "
                  f"restart={_num(hang['restart'])} {hang['reason']}", flush=True)
        end = time.monotonic() + args.deadline
        rec["codes"] = codes = [p.wait_exit(max(0.0, end - time.monotonic())) for p in procs]
        rec["ok"] = all(c == 0 for c in codes)
        if not rec["ok"]:
            rec["reason"] = f"exit codes {sorted(set(codes), key=str)}"
        return rec, hangs
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM from `timeout`: how far the launch got is still a result
        rec["cut"] = True
        rec["reason"] = f"cut by a signal {time.time() - t0:.0f} s after the first agent; phases: {_phases(d, n, t0)}"
        return rec, hangs
    finally:
        t_end = time.monotonic()
        h.end_agents(procs, token, rec)
        rec["teardown"] = round(time.monotonic() - t_end, 1)


def render(launches: list[dict], hangs: list[dict], args: argparse.Namespace) -> str:
    rows = []
    for sc in SCENARIOS:
        rs = [r for r in hangs if r["scenario"] == sc]
        if not rs:
            continue
        ok = [r for r in rs if r["ok"]]
        s = {k: h.summarize([r[k] for r in ok if r.get(k) is not None])
             for k in ("verdict_last", "inquiry_seconds", "restart")}
        within = sum(1 for r in ok if r["verdict_last"] <= args.step_timeout + 2)
        ops = [r["store"]["total_ops"] / r["agents"] for r in ok if r.get("store")]
        byts = [r["store"]["bytes"] / r["agents"] for r in ok if r.get("store")]
        rows.append([sc, f"{len(ok)}/{len(rs)}", f"{within}/{len(rs)}", h.fmt_cell(s["verdict_last"]),
                     h.fmt_cell(s["inquiry_seconds"]), h.fmt_cell(s["restart"]),
                     f"{sum(ops) / len(ops):.0f}" if ops else "-", f"{sum(byts) / len(byts) / 1e3:.1f}" if byts else "-"])
    started = h.summarize([r["started"] for r in launches if r.get("started") is not None])
    code = f"mbr_launch from {args.mbr_path}" if args.mbr_path else _code()
    start = "at once" if not args.stagger else f"agent 0 {args.stagger:g} s first"
    lines = [f"## Issue #31: hangs among {args.agents} agents of one rank each ({args.launcher})", "",
             *h.machine_lines(gpu=False, mbr_code=code), f"- command: `{h.command_line()}`",
             f"- {len(launches)} launch(es) of {args.agents} agents (`--standby {args.standby}`, `--step-timeout "
             f"{args.step_timeout:g}`; started {start})"
             f", each living through {args.hangs} hangs, one per round; every agent exit 0 "
             f"at the end in {sum(r['ok'] for r in launches)} of {len(launches)}; launch -> every rank started "
             f"{h.fmt_cell(started)}", "",
             h.table(["scenario", "ok (the victim named by every agent, every rank restarted)",
                      f"verdict within timeout + 2 s ({args.step_timeout + 2:g} s)",
                      "hang -> verdict on the last agent", "the inquiry itself (s)", "hang -> every rank restarted",
                      "store ops per agent, hang -> verdict", "store kB per agent"], rows), ""]
    failed = [r for r in hangs if not r["ok"]] + [r for r in launches if not r["ok"]]
    if failed:
        lines += ["Failed:", ""] + [f"- launch {r['launch']}" + (f" hang {r['hang']} ({r['scenario']})" if "hang" in r
                                                                 else "") + f": {r['reason']}" for r in failed] + [""]
    return "\n".join(lines)


def _code() -> str:
    rev = run_quiet(["git", "-C", str(h.REPO), "rev-parse", "--short", "HEAD"])
    dirty = run_quiet(["git", "-C", str(h.REPO), "status", "--porcelain", "--untracked-files=no"])
    return f"the working tree at {rev}{' with changes' if dirty else ''}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", type=int, default=32)
    ap.add_argument("--launches", type=int, default=1)
    ap.add_argument("--hangs", type=int, default=30, help="hangs per launch, one per round")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--victim", type=int, default=17, help="the rank that hangs (sleep, sigstop)")
    ap.add_argument("--step-timeout", type=float, default=8.0)
    ap.add_argument("--standby", default="torch", choices=("torch", "off"))
    ap.add_argument("--steady", type=float, default=3.0, help="seconds of stepping before the hang")
    ap.add_argument("--deadline", type=float, default=240.0)
    ap.add_argument("--stagger", type=float, default=0.0, help="seconds between the first agent and the others "
                    "(0: all at once, as srun starts them)")
    ap.add_argument("--launcher", default="mbr-launch", choices=("mbr-launch", "torchrun"),
                    help="torchrun: the launch alone, to compare launch -> every rank started (needs --hangs 0)")
    ap.add_argument("--count-store", action="store_true")
    ap.add_argument("--mbr-path", type=Path, help="run mbr_launch from this directory (PYTHONPATH), e.g. a "
                    "`git archive REV mbr_launch` of the code before a change")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--raw", type=Path)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    scenarios = [s for s in args.scenarios.split(",") if s]
    if args.launcher == "torchrun" and args.hangs:
        ap.error("--launcher torchrun measures the launch alone: give --hangs 0")
    h.stop_on_sigterm()  # a killed bench still stops its agents (the finally below)
    root = work_dir("scale-hang")
    launches: list[dict] = []
    hangs: list[dict] = []
    try:
        for i in range(args.launches):
            plan = [scenarios[(i + g) % len(scenarios)] for g in range(args.hangs)]
            rec, done = launch(plan, root, i, args)
            launches.append(rec)
            hangs += done
            print(f"[launch {i + 1}/{args.launches}] ok={rec['ok']} started={rec.get('started')} "
                  f"hangs ok {sum(x['ok'] for x in done)}/{len(done)} teardown {rec['teardown']} s "
                  f"(processes left after it: {rec.get('still_alive', 0)}) {rec['reason']}", flush=True)
            if rec.get("cut"):
                break
    finally:
        finish_dir(root, args.keep)
    h.write_raw(args.raw, launches + hangs)
    text = render(launches, hangs, args)
    print(text)
    if args.out:
        h.write_section(args.out, SECTION, text)
    return 0 if all(r["ok"] for r in launches + hangs) and len(hangs) == args.hangs * args.launches else 1


if __name__ == "__main__":
    sys.exit(main())
