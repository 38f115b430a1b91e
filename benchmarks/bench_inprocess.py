"""NVRx's in-job + in-process restart example under ft_launcher and under mbr-launch: same machine, same flags,
same faults. Wall time, job restarts, in-process restarts, iterations finished, every launcher's exit code.

The example (third_party/nvrx-v0.4.1/examples/fault_tolerance/in_job_and_in_process_example.py, unmodified)
runs as its run_inprocess_injob_example.sh runs it: three launchers of two ranks, ``--nnodes=2:3
--max-restarts=2 --ft-restart-policy=min-healthy``, heartbeat timeouts 12 s, ``--rdzv-conf is_host=1|0``
(the flags are read from that script by testkit/nvrx_ipr_example.py), on a free port instead of 29500, with the
checkpoint in the trial's directory. Faults (default: the issue's compressed schedule, 900 iterations):
rank 5 raises at 100, SIGKILLs of ranks 5, 4, 3 at 200, 300, 400 (the third leaves one node with every rank
alive, fewer than MIN=2: one job restart), rank 5 sleeps at 700 (a hang: a second job restart).

A run counts as finished when every launcher exits 0 and rank 0 logged the last iteration; the report also
says which faults the worker never issued (a run that resumed from a checkpoint past a fault's iteration). A run still going
at ``--timeout`` has its launchers SIGKILLed (exit code shown as "killed"). Job restarts: mbr-launch's from
its events.jsonl (restart_count), ft_launcher's from its "restarting worker group" log lines (each agent logs
one per restart: the most any agent logged). In-process restarts: the Wrapper's ``restart_ex`` lines of rank
0. Runs are one at a time (the example keeps its faults' state in fixed /tmp files) and hold the lock of
testkit/nvrx_ipr_example.py, so a test of the example cannot run meanwhile.

    python benchmarks/bench_inprocess.py --out benchmarks/RESULTS.md    # ~12 min: ft_launcher runs to --timeout
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness as h  # noqa: E402
from testkit.nvrx_ipr_example import commands, exclusive, for_launcher, iterations_done  # noqa: E402

SECTION = "bench_inprocess"
CHOICES = ["mbr-launch", "ft_launcher"]
COMPRESSED = "5:100:exc,5:200:sigkill,4:300:sigkill,3:400:sigkill,5:700:sleep"
_FT_RESTART = re.compile(r"restart attempts left; restarting worker group")
_IPR = re.compile(r"rank=0 restart_ex: ")
_ABORTED = re.compile(r"Unexpected _handle_msg call, current state: RankMonitorState.ABORTED")
_ISSUED = re.compile(r"Issuing simulated fault _SimFaultDesc\(rank=(\d+), iteration=(\d+), fault_type='(\w+)'\)")


def trial(name: str, root: Path, index: int, args: argparse.Namespace, mbr_env: dict[str, str]) -> dict:
    d = root / f"{index:03d}-{name}"
    d.mkdir(parents=True)
    token = uuid.uuid4().hex
    env = h.bench_env(token, {"TORCH_CPP_LOG_LEVEL": "ERROR", **(mbr_env if name == "mbr-launch" else {})})
    launcher = [h.tool(name)]
    per_agent = [["--log-dir", str(d / f"logs{i}")] if name == "mbr-launch" else [] for i in range(3)]
    argvs = commands(launcher, port=h.free_port(), faults=args.faults, iterations=args.iterations,
                     checkpoint_dir=d, per_agent=per_agent, example=for_launcher(launcher, env=env, cwd=d))
    rec: dict = {"launcher": name, "trial": index, "ok": False, "reason": "", "load_start": os.getloadavg()[0]}
    procs: list[h.Proc] = []
    rcs: list[int | None] = [None, None, None]
    with exclusive():
        try:
            procs = [h.Proc(argv, env=env, out_dir=d, name=f"agent{i}") for i, argv in enumerate(argvs)]
            t0 = min(p.t0 for p in procs)
            for p in procs:
                p.wait_exit(max(0.0, t0 + args.timeout - time.monotonic()))
            rcs = [p.poll() for p in procs]
            rec["wall"] = max(p.t_exit or time.monotonic() for p in procs) - t0
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill_session()
            time.sleep(1.0)
            rec["leftovers"] = len(h.marked_pids(token))
            h.kill_marked(token)
            for p in procs:
                p.close()
    rec["load_end"] = os.getloadavg()[0]
    rec["rcs"] = rcs
    logs = "\n".join(p.stdout_path.read_text(errors="replace") + p.stderr_path.read_text(errors="replace")
                     for p in procs)
    rec["iterations"] = iterations_done(logs)
    rec["in_process"] = len(_IPR.findall(logs))
    rec["aborted"] = len(_ABORTED.findall(logs))
    issued = {":".join(m) for m in _ISSUED.findall(logs)}
    rec["not_reached"] = [f for f in args.faults.split(",") if f not in issued]
    if name == "mbr-launch":
        events = [e for i in range(3) for e in h.read_events(d / f"logs{i}")]
        rec["restarts"] = max((e.get("restart_count") or 0 for e in events if e["event"] == "restart"), default=0)
        rec["lost"] = sorted(r for e in events if e["event"] == "rank_lost" for r in e["ranks"])
        rec["hangs"] = sorted({tuple(e["culprits"]) for e in events if e["event"] == "verdict" and e["culprits"]})
        rec["withdrawn"] = sum(1 for e in events if e["event"] == "verdict" and e.get("basis") == "withdrawn")
    else:
        rec["restarts"] = max(len(_FT_RESTART.findall(p.stdout_path.read_text(errors="replace")
                                                      + p.stderr_path.read_text(errors="replace"))) for p in procs)
    rec["ok"] = rcs == [0, 0, 0] and rec["iterations"] == args.iterations
    if not rec["ok"]:
        rec["reason"] = (f"exit codes {_codes(rcs)}, {rec['iterations']}/{args.iterations} iterations"
                         + (f", {rec['aborted']} heartbeats refused by an ABORTED rank monitor" if rec["aborted"]
                            else ""))
    return rec


def _codes(rcs: list[int | None]) -> str:
    return ", ".join("killed" if rc is None or rc == -9 else str(rc) for rc in rcs)


def render(records: list[dict], args: argparse.Namespace) -> str:
    rows = []
    for r in records:
        extra = []
        if r.get("lost"):
            extra.append(f"ranks left lost (min-healthy): {r['lost']}")
        if r.get("hangs"):
            extra.append(f"hang verdicts: {', '.join(str(list(c)) for c in r['hangs'])}")
        if r.get("withdrawn"):
            extra.append(f"{r['withdrawn']} inquiries withdrawn (deadlines passed during in-process restarts)")
        if r.get("not_reached"):
            extra.append(f"faults never issued: {', '.join(r['not_reached'])}")
        if r.get("aborted"):
            extra.append(f"{r['aborted']} heartbeats refused: rank monitor ABORTED")
        rows.append([r["launcher"], "yes" if r["ok"] else "no", _codes(r["rcs"]), h.fmt_s(r.get("wall")),
                     f"{r['iterations']}/{args.iterations}", str(r["restarts"]), str(r["in_process"]),
                     f"{r['load_start']:.1f} / {r['load_end']:.1f}", "; ".join(extra) or "-"])
    out = [f"## NVRx in-job + in-process example: ft_launcher and mbr-launch, faults `{args.faults}`, "
           f"{args.iterations} iterations", "", *h.machine_lines(gpu=False, mbr_code=args.mbr_code),
           f"- command: `{h.command_line()}`",
           "- the example's own flags (run_inprocess_injob_example.sh): 3 launchers of 2 ranks, `--nnodes=2:3 "
           "--max-restarts=2 --ft-restart-policy=min-healthy --ft-rank-heartbeat-timeout=12 "
           "--ft-initial-rank-heartbeat-timeout=12`, gloo on CPU (the script's default device); "
           f"one run at a time; a run still going after {args.timeout:.0f} s is SIGKILLed", "",
           h.table(["launcher", "finished", "exit codes", "wall", "iterations", "job restarts",
                    "in-process restarts (rank 0)", "load start / end", "notes"], rows), ""]
    out += h.failure_lines(records)
    return "\n".join(out)


def main() -> int:
    parser = h.bench_parser(__doc__, trials=1, choices=CHOICES, default=",".join(CHOICES), gpu=False, nproc=False)
    parser.add_argument("--faults", default=COMPRESSED, help="the worker's --fault-iters (rank:iteration:kind,...)")
    parser.add_argument("--iterations", type=int, default=900, help="the worker's --total-iterations")
    parser.add_argument("--timeout", type=float, default=560.0, help="seconds before a run's launchers are killed")
    args = parser.parse_args()
    session = h.start(args, "inprocess")
    names = h.variant_names(args.launchers, {n: n for n in CHOICES}, CHOICES)
    mbr_env = h.mbr_env(session.mbr_path)
    done = h.run_trials(args, session, h.plan(names, args.trials),
                        lambda step: trial(step.item, session.root, step.trial, args, mbr_env),
                        lambda r: f"finished in {r['wall']:.1f} s, {r['restarts']} job restarts",
                        width=12)
    return h.publish(args, SECTION, render(done.records, args), done.records)


if __name__ == "__main__":
    sys.exit(main())
