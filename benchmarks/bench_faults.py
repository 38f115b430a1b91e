"""The fault matrix (issue 16) as a table: every case of testkit/fault_cases.py (the same table the tests run),
with torchrun beside mbr-launch where it can run the same fault cheaply.

Per case: the outcome against the expected one (survived = every agent exited 0 after recovering; else the
documented exit code), seconds from the fault to its first record in events.jsonl (detection: a ``failure``,
``hang``, ``verdict``, ``peer_lost``, ``monitor_lost``, ``signal`` or ``preemption`` event; for a rendezvous
that timed out, the ``end``) and to recovery (every rank of the next round started again: the last
``worker_start`` of that round), what events.jsonl recorded, and the processes left behind: those of a
SIGKILLed agent still alive 3 s after it (orphans), and every process carrying this case's token 3 s after
the case ended. Fault times: the bench's own clock when it injects the fault (signals, kills, a cut link);
the worker's clock when the worker injects it (its ready or hang line, written just before).

Cases run one after the other (not interleaved: each is one job, and the table is about what happens, not a
race); ``--trials N`` runs the whole matrix N times and reports each time. Cases that need root, network
namespaces or the Slurm test cluster (``--slurm``: started here through testkit/slurm_cluster.py and stopped at
the end) are reported as skipped where those are missing.

    python benchmarks/bench_faults.py --slurm --out benchmarks/RESULTS.md
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import traceback
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness as h  # noqa: E402  (puts the repository on sys.path)

from testkit import netns  # noqa: E402
from testkit.fault_cases import CASES, CASES_BY_NAME  # noqa: E402
from testkit.fault_runs import Ctx, Run, detection, recovery  # noqa: E402
from testkit.fault_spec import Case, verify  # noqa: E402
from testkit.fault_workers import TORCHRUN_LIMIT  # noqa: E402
from testkit.helpers import launcher_env  # noqa: E402

SECTION = "bench_faults"
LEFTOVER_GRACE = 3.0
SHOWN = ("failure", "hang", "verdict", "peer_lost", "monitor_lost", "signal", "preemption", "requeue", "restart",
         "end")


def unavailable(case: Case, cluster: object) -> str:
    if "root" in case.needs and os.geteuid() != 0:
        return "needs root"
    if "netns" in case.needs and (why := netns.available()):
        return why
    if "slurm" in case.needs and cluster is None:
        return "needs the Slurm test cluster (--slurm)"
    return ""


def leftovers(token: str) -> list[str]:
    """Processes carrying the token LEFTOVER_GRACE s after the case ended (then killed)."""
    deadline = time.monotonic() + LEFTOVER_GRACE
    while (pids := h.marked_pids(token)) and time.monotonic() < deadline:
        time.sleep(0.1)
    described = [f"{pid}: {_cmd(pid)}" for pid in pids]
    h.kill_marked(token)
    return described


def _cmd(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()[:120]
    except OSError:
        return "?"


def run_one(case: Case, scenario, root: Path, tag: str, cluster: object) -> dict:
    """One scenario (ours or torchrun's) with its own token, directory and leftover count."""
    token = uuid.uuid4().hex
    tmp = root / f"{case.name}-{tag}"
    tmp.mkdir(parents=True)
    env = {**launcher_env(), h.MARKER: token}
    env.pop("MBR_TEST_SESSION", None)
    rec: dict = {"case": case.name, "who": tag, "ok": False}
    t0 = time.time()
    try:
        run = scenario(Ctx(tmp, env, cluster=cluster))
    except Exception as err:  # a scenario that cannot proceed is a failed case, with its reason
        rec.update(error=f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:300],
                   trace=traceback.format_exc()[-3000:], seconds=time.time() - t0)
        rec["left"] = leftovers(token)
        return rec
    rec.update(codes=run.codes, seconds=time.time() - t0, orphans=run.orphans, info_hung=run.info.get("hung"))
    if tag == "mbr-launch":
        rec["problems"] = verify(case, run)
        rec["ok"] = not rec["problems"]
        found = detection(run)
        rec["detect"] = found[0] if found else None
        rec["recover"] = recovery(run)
        rec["recorded"] = recorded(run)
    else:
        rec["exit_after"] = None if run.t_fault is None or run.info.get("hung") else run.t_end - run.t_fault
        rec["restarted"] = sorted({n for _r, n in run.info.get("ready", [])}) == [0, 1]
        if run.codes and run.codes[0] not in (0, None) and not run.info.get("hung"):
            label, line = h.classify(run.stderr[0].splitlines()[-400:])
            rec["reason"] = label or line[:160]
    rec["left"] = leftovers(token)
    if cluster is not None and "slurm" in case.needs:
        cluster.reset()
    return rec


def recorded(run: Run) -> str:
    """The fault as events.jsonl has it: the key events of each agent, in order."""
    parts = []
    for i, events in enumerate(run.events):
        shown = [_short(e) for e in events if e["event"] in SHOWN]
        if shown:
            parts.append((f"a{i}: " if len(run.events) > 1 else "") + ", ".join(dict.fromkeys(shown)))
    return " / ".join(parts) or "nothing"


def _short(e: dict) -> str:
    name = e["event"]
    if name == "failure":
        how = e.get("signal") or (f"exit {e['exit_code']}" if e.get("exit_code") is not None else "")
        who = f"rank {e['rank']}" if (e.get("rank") or 0) >= 0 else "node"
        return f"failure({who}, {e.get('cause')}{', ' + how if how else ''})"
    if name == "hang":
        return f"hang(rank {e.get('rank')}, {e.get('kind')})"
    if name == "verdict":
        return f"verdict(culprits {e.get('culprits')}, {e.get('basis')})"
    if name == "peer_lost":
        return f"peer_lost({e.get('kind')})"
    if name in ("signal", "preemption"):
        return f"{name}({e.get('signal')})"
    if name == "restart":
        return "restart"
    if name == "requeue":
        return f"requeue(ok={e.get('ok')})"
    if name == "end":
        return f"end({e.get('exit_code')})"
    return name


# ---- report -------------------------------------------------------------------------------------------

def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _outcome(codes: list | None) -> str:
    if not codes:
        return "?"
    shown = ["killed" if c is None or c == -9 else str(c) for c in codes]
    if all(c == "killed" for c in shown):
        return "killed by the case"
    return "survived (0)" if all(c == "0" for c in shown) else "exit " + "/".join(shown)


def _torchrun_cell(rec: dict | None) -> str:
    if rec is None:
        return "-"
    if rec.get("error"):
        return f"failed to run: {rec['error'][:80]}"
    if rec.get("info_hung"):
        return f"still hung {TORCHRUN_LIMIT:.0f} s after the fault, killed by the bench"
    code = (rec.get("codes") or [None])[0]
    left = f"; {len(rec['left'])} left" if rec.get("left") else ""
    how = ("restarted, then " if rec.get("restarted") else "") + f"exit {code}"
    why = f": {rec['reason']}" if rec.get("reason") else ""
    return f"{how} ({_s(rec.get('exit_after'))} s after the fault){why}{left}"


def render(records: list[dict], args: argparse.Namespace, skipped: dict[str, str]) -> str:
    rows, notes = [], []
    by_case = {(r["case"], r.get("trial", 0), r["who"]): r for r in records}
    for rec in [r for r in records if r["who"] == "mbr-launch"]:
        case = CASES_BY_NAME[rec["case"]]
        trial = rec.get("trial", 0)
        got = rec.get("error") or _outcome(rec.get("codes"))
        mark = "ok" if rec["ok"] else ("known bug" if case.known_bug else "FAIL")
        left = len(rec.get("left") or []) + len(rec.get("orphans") or [])
        rows.append([f"`{case.name}`" + (f" #{trial}" if args.trials > 1 else ""), case.fault, case.outcome,
                     f"{got} ({mark})", _s(rec.get("detect")), _s(rec.get("recover")),
                     rec.get("recorded", "-"), str(left), _torchrun_cell(by_case.get((case.name, trial, "torchrun")))])
        if not rec["ok"]:
            why = " ".join((rec.get("error") or "; ".join(rec.get("problems") or [])).split())
            tag = (f" Known bug: {case.known_bug}." if case.known_bug else
                   f" Depends on {case.pending}." if case.pending else "")
            notes.append(f"- `{case.name}`: {why[:600]}.{tag}")
        for what, pids in (("orphans of the killed agent", rec.get("orphans")), ("left after the case", rec.get("left"))):
            if pids:
                notes.append(f"- `{case.name}`: {what}: " + "; ".join(pids[:6]))
    passed = sum(1 for r in records if r["who"] == "mbr-launch" and r["ok"])
    total = sum(1 for r in records if r["who"] == "mbr-launch")
    out = ["## Fault matrix (issue 16): every fault, what came of it, what events.jsonl recorded", "",
           *h.machine_lines(gpu=False, mbr_code=args.mbr_code),
           f"- command: `{h.command_line()}`; load average at end {os.getloadavg()[0]:.2f}; "
           f"{passed} of {total} cases as expected",
           "- cases: `testkit/fault_cases.py` (the table `tests/test_fault_matrix.py` runs); *detect*: seconds from "
           "the fault to its first record in events.jsonl (for hangs this includes the timeout); *recover*: to the "
           "last `worker_start` of the next round; *left*: processes alive 3 s after a killed agent or after the "
           "case (0 expected); torchrun (2.x, `--max-restarts 1`, default store sharing) runs the same worker and "
           "fault where it can (hangs: tests/scripts/hangs.py's fault, as torchrun has no rank monitor for an NVRx "
           "client), in the same run", "",
           h.table(["case", "fault", "expected", "mbr-launch", "detect s", "recover s", "events.jsonl recorded",
                    "left", "torchrun, same fault"], rows), ""]
    if skipped:
        out += ["Skipped: " + "; ".join(f"`{k}` ({v})" for k, v in skipped.items()) + ".", ""]
    if notes:
        out += ["Cases not as expected, and processes left behind:", "", *notes, ""]
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    parser.add_argument("--trials", type=int, default=1, help="run the matrix this many times")
    parser.add_argument("--no-torchrun", action="store_true", help="skip the torchrun runs")
    parser.add_argument("--slurm", action="store_true", help="start the Slurm test cluster and run its cases")
    parser.add_argument("--out", type=Path, help="write/replace this bench's section in FILE")
    parser.add_argument("--raw", type=Path, help="write every record as JSON to FILE")
    parser.add_argument("--keep", action="store_true", help="keep the cases' directories (path printed)")
    args = parser.parse_args()
    names = [n.strip() for n in args.cases.split(",") if n.strip()] or [c.name for c in CASES]
    if bad := [n for n in names if n not in CASES_BY_NAME]:
        raise SystemExit(f"--cases: unknown {bad}; choose from {', '.join(CASES_BY_NAME)}")
    _path, args.mbr_code = h.mbr_source("tree", Path(tempfile.gettempdir()))
    root = Path(tempfile.mkdtemp(prefix="mbr-bench-faults-"))
    cluster = None
    records: list[dict] = []
    skipped: dict[str, str] = {}
    try:
        if args.slurm and any("slurm" in CASES_BY_NAME[n].needs for n in names):
            from testkit import slurm_cluster

            cluster = slurm_cluster._start()
        for trial in range(args.trials):
            for name in names:
                case = CASES_BY_NAME[name]
                if why := unavailable(case, cluster):
                    skipped[name] = why
                    continue
                for tag, scenario in (("mbr-launch", case.run), ("torchrun", case.torchrun)):
                    if scenario is None or (tag == "torchrun" and args.no_torchrun):
                        continue
                    rec = run_one(case, scenario, root / f"t{trial}", tag, cluster)
                    rec["trial"] = trial
                    records.append(rec)
                    status = "ok" if rec["ok"] else (rec.get("error") or "; ".join(rec.get("problems") or []))[:160]
                    print(f"[{trial}] {name:26s} {tag:10s} {rec.get('seconds', 0):6.1f} s  codes "
                          f"{rec.get('codes')}  {status if tag == 'mbr-launch' else _torchrun_cell(rec)}",
                          file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        print("interrupted: reporting the cases run so far", file=sys.stderr)
    finally:
        if cluster is not None and os.environ.get("MBR_SLURM_KEEP") != "1":
            from testkit import slurm_cluster

            slurm_cluster._stop()
        if args.keep:
            print(f"case directories kept in {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    text = render(records, args, skipped)
    h.write_raw(args.raw, records)
    print("\n" + text)
    if args.out:
        h.write_section(args.out, SECTION, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
