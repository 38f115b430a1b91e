"""Hang attribution: does the launcher name the rank that hung, or a rank waiting for it? And how fast?

Every scenario of ``tests/scripts/hangs.py`` (a training-like worker: a tiny model, a DataLoader, an
all_reduce of the gradients and an optimizer step every ~50 ms) under every launcher, ``--max-restarts 0``.
At step ``--hang-step`` (~1 s in) the culprit goes wrong inside the step, after its heartbeat and before the
step's all_reduce, so its peers block in that all_reduce and every heartbeat stops together: the case a
deadline alone cannot tell apart (see issue #14). Scenarios: sleep, sigstop, busy (GIL-holding loop),
dataloader / dataloader_workers (a blocking ``__getitem__``, 0 and 2 workers), other_collective (the culprit
in a barrier of another group), crash_cascade (the culprit raises; its peers die of "Connection closed by
peer"). The culprit alternates between rank 1 (even trials) and rank 0 (odd), so no launcher is right by
always blaming the same rank.

Launchers (all with the same timeout ``--timeout``, default 3 s):
- mbr-launch: NVRx RankMonitorClient, section ``step`` around each step (``--section-timeouts step:T``);
  named = its ``verdict`` event's culprits, else the rank of its first ``failure`` event;
- mbr-launch-zerocode: no client, ``--step-timeout T`` (the autobeat hook counts optimizer steps);
- ft_launcher (NVRx 0.4.1): the same client, ``--ft-rank-section-timeouts step:T``,
  ``--ft-workload-check-interval 0.5``; named = the rank of its first rank-monitor timeout line
  (``Section 'step' has been open``, ``Did not get ... heartbeat``), else the torch elastic root cause;
- torchrun: no client, a process-group timeout of T s (``init_process_group(timeout=...)``); named = the rank
  whose error mentions the timeout first, else the torch elastic root cause.
For crash_cascade every launcher is read by the first failure it records (mbr-launch's first ``failure``
event, the root cause of ft_launcher / torchrun).

Per trial: hang start = the culprit's own ``time.time()`` as the fault starts (its hang file); named after =
the launcher's record of its decision (mbr-launch's verdict / first hang or failure event, ft_launcher's log
line; torchrun's exit, which is where it decides) minus hang start; culprit gone = the culprit's exit seen by
a pidfd in the bench, minus hang start.

    python benchmarks/bench_attribution.py --trials 10 --out benchmarks/RESULTS.md
    python benchmarks/bench_attribution.py --trials 1 --scenarios sleep,busy --launchers ft_launcher,torchrun
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness as h

SECTION = "bench_attribution"
HANGS = h.REPO / "tests" / "scripts" / "hangs.py"
SCENARIOS = ["sleep", "sigstop", "busy", "dataloader", "dataloader_workers", "other_collective", "crash_cascade"]


def _mbr(client_flags: list[str]):
    def argv(s: h.LaunchSpec) -> list[str]:
        return [h.tool("mbr-launch"), "--standalone", "--nproc-per-node", str(s.nproc), "--max-restarts",
                str(s.max_restarts), "--log-dir", str(s.log_dir), "--skip-check", "all", "--status", "off",
                "--hang-kill-grace", "1", *client_flags, *s.worker]
    return argv


def _ft(timeout: float):
    def argv(s: h.LaunchSpec) -> list[str]:
        return [h.tool("ft_launcher"), "--standalone", "--nproc-per-node", str(s.nproc), "--max-restarts",
                str(s.max_restarts), "--ft-initial-rank-heartbeat-timeout", "60", "--ft-rank-heartbeat-timeout", "60",
                "--ft-rank-section-timeouts", f"step:{timeout:g}", "--ft-workload-check-interval", "0.5", *s.worker]
    return argv


def _torchrun(s: h.LaunchSpec) -> list[str]:
    return [h.tool("torchrun"), "--standalone", "--nproc-per-node", str(s.nproc), "--max-restarts",
            str(s.max_restarts), *s.worker]


def arms(timeout: float) -> dict[str, tuple[h.Launcher, str]]:
    """name -> (launcher, the worker's --client)."""
    t = f"{timeout:g}"
    return {
        "mbr-launch": (h.Launcher("mbr-launch", _mbr(["--heartbeat-timeout", "60", "--section-timeouts", f"step:{t}"]),
                                  note=f"NVRx client, --section-timeouts step:{t}"), "nvrx"),
        "mbr-launch-zerocode": (h.Launcher("mbr-launch-zerocode", _mbr(["--step-timeout", t]),
                                           note=f"no client, --step-timeout {t}"), "none"),
        "ft_launcher": (h.Launcher("ft_launcher", _ft(timeout),
                                   note=f"NVRx client, --ft-rank-section-timeouts step:{t}, check interval 0.5 s"),
                        "nvrx"),
        "torchrun": (h.Launcher("torchrun", _torchrun, note=f"no client, process-group timeout {t} s"), "none"),
    }


CHOICES = list(arms(3.0))


# ---- what each launcher named, and when ----------------------------------------------------------------

FT_TIMEOUT_LINE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\] \[\w+\] \[RankMonServer\d+@[^:\]]*:(\d+)\] "
                             r"(Did not get (?:initial|subsequent) heartbeat|Section '[^']*' has been open|"
                             r"Was out of section)")
ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):.*?rank\s*:\s*(\d+)", re.S)
TIMEOUT_ERROR = re.compile(r"^\[rank(\d+)\]:.*(?:[Tt]imed out|[Tt]imeout|DistBackendError)", re.M)


def read_hang(path: Path) -> tuple[int, float, int] | None:
    """(culprit rank, hang start time.time(), pid) from the culprit's hang file."""
    try:
        parts = path.read_text().split()
    except FileNotFoundError:
        return None
    if len(parts) >= 4 and parts[0] == "hang":
        return int(parts[1]), float(parts[2]), int(parts[3])
    return None


def mbr_named(events: list[dict]) -> tuple[int | None, float | None, str]:
    """(rank named, when, on what): the verdict event, else the first failure (a hang event's time if any)."""
    verdict = next((e for e in events if e["event"] == "verdict"), None)
    if verdict is not None:
        culprits = verdict.get("culprits") or []
        return (culprits[0] if len(culprits) == 1 else None), h.parse_ts(verdict["ts"]), "verdict"
    failure = next((e for e in events if e["event"] == "failure"), None)
    if failure is None:
        return None, None, "none"
    first = next((e for e in events if e["event"] in ("hang", "failure")), failure)
    return failure.get("rank"), h.parse_ts(first["ts"]), f"first failure ({failure.get('cause')})"


def ft_named(stderr: str) -> tuple[int | None, float | None, str]:
    for line in stderr.splitlines():
        m = FT_TIMEOUT_LINE.match(line)
        if m:
            when = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            return int(m.group(2)), when, "rank monitor timeout"
    root = ROOT_CAUSE.search(stderr)
    return (int(root.group(1)) if root else None), None, "root cause"


def torchrun_named(stderr: str, t_exit: float | None) -> tuple[int | None, float | None, str]:
    m = TIMEOUT_ERROR.search(stderr)
    if m:
        return int(m.group(1)), t_exit, "timeout error"
    root = ROOT_CAUSE.search(stderr)
    return (int(root.group(1)) if root else None), t_exit, "root cause"


# ---- one trial ------------------------------------------------------------------------------------------

def attribution_trial(name: str, launcher: h.Launcher, client: str, scenario: str, culprit: int, root: Path,
                      index: int, args: argparse.Namespace) -> dict:
    def spec(d: Path) -> h.LaunchSpec:
        worker = [str(HANGS), "--scenario", scenario, "--culprit", str(culprit), "--client", client,
                  "--hang-step", str(args.hang_step), "--hang-file", str(d / "hang"), "--ready-file", str(d / "ready"),
                  "--pg-timeout", f"{args.timeout:g}" if name == "torchrun" else "600"]
        if args.gpu:
            worker += ["--device", "cuda"]
        return h.LaunchSpec(nproc=args.nproc, max_restarts=0, log_dir=d / "logs", worker=worker)

    rec: dict = {"launcher": name, "scenario": scenario, "culprit": culprit, "trial": index, "ok": False,
                 "reason": ""}
    with h.Trial(launcher, spec, root / scenario, index) as t:
        assert t.proc
        end = time.monotonic() + args.deadline
        while (hung := read_hang(t.dir / "hang")) is None and time.monotonic() < end and t.proc.poll() is None:
            time.sleep(0.01)
        if hung is None:
            rec["reason"] = h.failure_reason(t.proc, f"the culprit never started its fault (rc {t.proc.poll()})")
            return rec
        _rank, t_hang, pid = hung
        watch = h.ExitWatch(pid, timeout=args.deadline)
        rc = t.proc.wait_exit(args.deadline)
        if rc is None:
            rec["reason"] = h.failure_reason(t.proc, f"no exit {args.deadline:.0f} s after the fault")
            return rec
        t_exit = time.time() - (time.monotonic() - t.proc.t_exit) if t.proc.t_exit else time.time()
        stderr = t.proc.stderr_path.read_text(errors="replace")
        if name.startswith("mbr-launch"):
            named, when, basis = mbr_named(h.read_events(t.spec.log_dir))
        elif name == "ft_launcher":
            named, when, basis = ft_named(stderr)
            if when is None and scenario == "crash_cascade":
                when = t_exit
        else:
            named, when, basis = torchrun_named(stderr, t_exit)
        time.sleep(0.05)  # the pidfd thread notes the culprit's exit
        rec.update(ok=True, rc=rc, named=named, right=named == culprit, basis=basis,
                   named_after=None if when is None else when - t_hang,
                   gone_after=None if watch.t_gone is None else watch.t_gone - t_hang, exit_after=t_exit - t_hang)
    rec["leftovers"] = t.leftovers
    return rec


# ---- report ---------------------------------------------------------------------------------------------

def render(records: list[dict], names: list[str], scenarios: list[str], args: argparse.Namespace) -> str:
    notes = {n: a[0].note for n, a in arms(args.timeout).items()}
    rows = []
    for scenario in scenarios:
        for name in names:
            recs = [r for r in records if r["launcher"] == name and r["scenario"] == scenario]
            if not recs:
                continue
            ok = [r for r in recs if r["ok"]]
            right = sum(1 for r in ok if r["right"])
            bases = sorted({r["basis"] for r in ok})
            rows.append([scenario, name, f"{right}/{len(ok)}" + (f" ({len(recs) - len(ok)} failed)" if len(ok) < len(recs) else ""),
                         h.fmt_cell(h.summarize([r["named_after"] for r in ok if r.get("named_after") is not None])),
                         h.fmt_cell(h.summarize([r["gone_after"] for r in ok if r.get("gone_after") is not None])),
                         ", ".join(bases) or "-"])
    dev = "NCCL on cuda:LOCAL_RANK (other_collective: a gloo side group)" if args.gpu else "gloo on CPU"
    out = [f"## Hang attribution: the culprit named, per scenario and launcher (timeout {args.timeout:g} s)", "",
           *h.machine_lines(gpu=args.gpu, mbr_code=args.mbr_code),
           f"- command: `{getattr(args, 'commands', '') or h.command_line()}`",
           (f"- load average at end {os.getloadavg()[0]:.2f}; worker `tests/scripts/hangs.py`, {args.nproc} ranks, "
            f"{dev}; the culprit goes wrong at step {args.hang_step}, inside the step before its all_reduce; "
            "culprit rank 1 in even trials, rank 0 in odd; `--max-restarts 0`; trials interleaved in rotating order"),
           "- launchers: " + "; ".join(f"{n}: {notes[n]}" for n in names),
           ("- *named the culprit*: trials whose launcher named the culprit (see the module docstring for what is "
            "read per launcher; *read from* says which record decided). *named after*: the launcher's own record "
            "of its decision minus the culprit's hang start (torchrun: its exit). *culprit gone*: the culprit's "
            "exit seen by a pidfd, minus hang start. Cells: median (p25 / p75)."), "",
           h.table(["scenario", "launcher", "named the culprit", "named after (s)", "culprit gone (s)", "read from"],
                   rows), ""]
    label = lambda r: f"{r['launcher']} {r['scenario']} trial {r['trial']}"  # noqa: E731
    out += h.failure_lines(records, label=label, leftovers=None)
    left = [r for r in records if r.get("leftovers")]
    if left:  # e.g. DataLoader workers of a killed rank that its launcher did not kill with it
        out += ["Processes still alive after the launcher exited (killed by the harness): "
                + "; ".join(f"{label(r)}: {r['leftovers']}" for r in left) + ".", ""]
    return "\n".join(out)


def main() -> int:
    parser = h.bench_parser(__doc__, trials=10, choices=CHOICES, from_raw=True)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"comma-separated subset of: "
                        f"{', '.join(SCENARIOS)}")
    parser.add_argument("--timeout", type=float, default=3.0, help="step / section / process-group timeout (s)")
    parser.add_argument("--hang-step", type=int, default=20, help="the step at which the culprit goes wrong")
    parser.add_argument("--deadline", type=float, default=60.0, help="seconds allowed per phase of a trial")
    args = parser.parse_args()
    scenarios = [s for s in (x.strip() for x in args.scenarios.split(",")) if s]
    if bad := [s for s in scenarios if s not in SCENARIOS]:
        raise SystemExit(f"--scenarios: unknown {bad}; choose from {', '.join(SCENARIOS)}")
    if args.from_raw:
        def from_raw(records: list[dict]) -> str:
            return render(records, h.launchers_in(records, CHOICES),
                          [s for s in SCENARIOS if any(r["scenario"] == s for r in records)], args)
        return h.render_raw(args, SECTION, from_raw)
    table = arms(args.timeout)
    names = h.variant_names(args.launchers, table, CHOICES)
    session = h.start(args, "attribution")
    items = [(s, n) for s in scenarios for n in names]

    def run(step: h.Step) -> dict:
        scenario, name = step.item
        launcher, client = table[name]
        culprit = 1 if step.trial % 2 == 0 else 0
        return attribution_trial(name, h.with_mbr_path(launcher, session.mbr_path), client, scenario, culprit,
                                 session.root, step.trial, args)

    def status(rec: dict) -> str:
        after = rec.get("named_after")
        return (f"{rec['scenario']:18s} culprit {rec['culprit']} named {rec['named']} "
                f"({'right' if rec['right'] else 'WRONG'}, {rec['basis']}) after "
                + ("-" if after is None else f"{after:.2f} s"))

    done = h.run_trials(args, session, h.plan(items, args.trials), run, status, width=20)
    return h.publish(args, SECTION, render(done.records, names, scenarios, args), done.records)


if __name__ == "__main__":
    sys.exit(main())
