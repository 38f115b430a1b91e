"""NVRx 0.7.0 under mbr-launch and under ft_launcher 0.7.0 itself, in the same run, interleaved (trial i runs
every launcher once, in an order rotated by i). The 0.7.0 wheel's client comes from ``.nvrx/0.7.0`` (scripts/setup)
first on PYTHONPATH, for the launcher and its workers alike; ft_launcher is that wheel's own console script
(``.nvrx/0.7.0/bin/ft_launcher``, the entry point its dist-info declares, run by the venv's Python).

Part ``msgcost``: what one message of the 0.7.0 client costs the rank (workers/nvrx_msgcost.py, 2 ranks by
default, config workers/nvrx07_msgcost.yaml: a ``step`` section, timeouts far beyond the run,
``skip_section_response`` at 0.7's default, True: heartbeats and sections sent fire-and-forget).
``send_heartbeat()`` and ``start_section("step")`` + ``end_section("step")``: paced (one call per
``--gap`` s, each timed: what a training step pays) and burst (back to back, per call once the socket buffers
are full: bounded by how fast the monitor reads, which fire-and-forget otherwise hides). mbr-launch serves
every local rank from one monitor process; ft_launcher runs one RankMonitorServer process per rank.

Part ``examples``: NVRx 0.7's own examples (third_party/nvrx-v0.7.0, unmodified, testkit/nvrx_examples.py's
command line and shortened arguments, the same for both launchers) from launch to exit:
``heartbeats`` (train_ddp_heartbeats_api.py, 3 epochs) and ``sections`` (train_ddp_sections_api.py, 2 epochs)
without a fault, ``heartbeats+sigkill`` (rank 1 SIGKILLed once rank 0 logs a step of epoch 2, as
tests/test_nvrx_examples.py does) and ``sections+sigstop`` (rank 1 SIGSTOPped in epoch 1: a hang, the case
where a launcher must find the rank). A run counts when the launcher exits 0 and the last epoch's validation
and ``Leaving main, ret_code=0`` were logged.

    python benchmarks/bench_nvrx07.py --trials 3 --out benchmarks/RESULTS.md      # ~15 min on 2 cores
    python benchmarks/bench_nvrx07.py --parts msgcost --trials 5
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness as h  # noqa: E402
from testkit.nvrx_examples import HEARTBEATS, SECTIONS, example_args, in_epoch  # noqa: E402
from testkit.nvrx_versions import nvrx_dir  # noqa: E402

SECTION = "bench_nvrx07"
VERSION = "0.7.0"
# Launcher variants: mbr-launch's extra flags, or None for ft_launcher. The default run compares the first and the
# last; mbr-launch-standby-off shows what the warm standbys cost or save on a small machine.
VARIANTS: dict[str, list[str] | None] = {"mbr-launch": [], "mbr-launch-standby-off": ["--standby", "off"],
                                         "ft_launcher": None}
CHOICES = list(VARIANTS)
FT = "ft_launcher"
PARTS = ["msgcost", "examples"]
MSGCOST_CFG = h.WORKERS / "nvrx07_msgcost.yaml"
MSGCOST_WORKER = h.WORKERS / "nvrx_msgcost.py"
# What each launcher logs when its rank monitor times a rank out / when it restarts the worker group.
# 0.7's log lines name the local rank a monitor serves: "[workload:?(0) infra:?(?)] rank_monitor_server.py:522 ...".
_FT_TIMEOUT = re.compile(r"\[workload:[^(\]]*\((\d+)\) infra:[^\]]*\] rank_monitor_server\.py:\d+ \[Cycle \d+\] "
                         r"(?:Section '\w+' has been open|Was out of section|Did not get)")
_FT_RESTART = re.compile(r"Worker group (?:UNHEALTHY|FAILED)\. \d+/\d+ attempts left; will restart worker group")


@dataclass(frozen=True)
class Scenario:
    example: tuple[str, str]  # (YAML, script) in testkit/nvrx_examples.py
    epochs: int
    fault: str | None = None  # "SIGKILL" | "SIGSTOP" to rank 1
    when: int = 0  # the epoch whose step on rank 0 triggers it


SCENARIOS = {
    "heartbeats": Scenario(HEARTBEATS, 3),
    "heartbeats+sigkill": Scenario(HEARTBEATS, 3, "SIGKILL", 2),
    "sections": Scenario(SECTIONS, 2),
    "sections+sigstop": Scenario(SECTIONS, 2, "SIGSTOP", 1),
}


def launcher_cmd(name: str) -> list[str]:
    extra = VARIANTS[name]
    return [str(nvrx_dir(VERSION) / "bin" / "ft_launcher")] if extra is None else [h.tool("mbr-launch"), *extra]


def is_mbr(name: str) -> bool:
    return VARIANTS[name] is not None


def launcher_env(name: str, token: str, mbr_path: Path | None) -> dict[str, str]:
    """0.7.0 first on PYTHONPATH for both; mbr-launch's --mbr-source snapshot ahead of it."""
    paths = [str(mbr_path)] if is_mbr(name) and mbr_path else []
    paths += [str(nvrx_dir(VERSION)), os.environ.get("PYTHONPATH", "")]
    return h.bench_env(token, {"PYTHONPATH": os.pathsep.join(p for p in paths if p)})


class Run:
    """One launcher run in the trial's directory, its processes marked with a token of their own; leaving the
    ``with`` kills what is left of it and counts what outlived a launcher that exited by itself."""

    def __init__(self, name: str, argv: list[str], d: Path, mbr_path: Path | None) -> None:
        self.token = os.urandom(16).hex()
        self.proc = h.Proc(argv, env=launcher_env(name, self.token, mbr_path), out_dir=d, name="launcher")
        self.leftovers = 0

    def __enter__(self) -> "Run":
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is not None:
            self.leftovers = len(h.marked_pids(self.token))
        self.proc.kill_session()
        h.kill_marked(self.token)
        self.proc.close()

    def text(self) -> str:
        return "".join(p.read_text(errors="replace") for p in (self.proc.stdout_path, self.proc.stderr_path))

    def outcome(self, rec: dict, rc: int | None) -> None:
        rec["rc"] = rc
        if rc is not None and self.proc.t_exit is not None:
            rec["wall"] = self.proc.t_exit - self.proc.t0


# ---- msgcost ---------------------------------------------------------------------------------------------

# (record key, label): the per-rank values the report compares; a section call is an open and a close.
METRICS = [("heartbeat_paced.median_us", "heartbeat, paced: median"),
           ("heartbeat_paced.p99_us", "heartbeat, paced: p99"),
           ("section_paced.median_us", "section open+close, paced: median"),
           ("section_paced.p99_us", "section open+close, paced: p99"),
           ("heartbeat_burst.per_call_us", "heartbeat, burst: per call"),
           ("section_burst.per_call_us", "section open+close, burst: per call"),
           ("heartbeat_burst.max_us", "heartbeat, burst: slowest call"),
           ("section_burst.max_us", "section open+close, burst: slowest call"),
           ("heartbeat_burst.monitor_cpu_us", "monitor CPU per heartbeat, burst"),
           ("section_burst.monitor_cpu_us", "monitor CPU per section open+close, burst"),
           ("heartbeat_paced.monitor_cpu_us", "monitor CPU per heartbeat, paced"),
           ("section_paced.monitor_cpu_us", "monitor CPU per section open+close, paced")]
# The launcher process itself (agent_cpu_us in the raw records) used 0-3 ticks per phase under both launchers:
# too few for a row.


def msgcost_trial(name: str, d: Path, args: argparse.Namespace, mbr_path: Path | None) -> dict:
    argv = [*launcher_cmd(name), "--standalone", f"--nproc-per-node={args.nproc}", "--max-restarts=0",
            f"--log-dir={d / 'logs'}", f"--ft-cfg-path={MSGCOST_CFG}", str(MSGCOST_WORKER), "--out-dir",
            str(d / "res"), "--paced", str(args.paced), "--gap", str(args.gap), "--burst", str(args.burst)]
    rec: dict = {"ok": False, "reason": "", "rc": None, "wall": None, "load_start": os.getloadavg()[0]}
    with Run(name, argv, d, mbr_path) as run:
        run.outcome(rec, run.proc.wait_exit(args.timeout))
        ranks = []
        for r in range(args.nproc):
            try:
                ranks.append(json.loads((d / "res" / f"rank{r}.json").read_text()))
            except (OSError, ValueError):
                pass
        rec["ranks"] = ranks
        if rec["rc"] == 0 and len(ranks) == args.nproc:
            rec["ok"] = True
            # *_cpu_us: rank 0's alone (it measures the launcher side for all ranks)
            rec["values"] = {key: statistics.median(_get(r, key) for r in ranks if _has(r, key)) for key, _ in METRICS}
            rec["skip_section_response"] = sorted({str(r.get("skip_section_response")) for r in ranks})
        else:
            what = (f"exit code {rec['rc']}" if rec["rc"] is not None else "no exit within the timeout")
            rec["reason"] = h.failure_reason(run.proc, f"{what}, {len(ranks)}/{args.nproc} ranks wrote results")
    rec["leftovers"] = run.leftovers
    return rec


def _has(d: dict, dotted: str) -> bool:
    a, b = dotted.split(".")
    return b in d.get(a, {})


def _get(d: dict, dotted: str) -> float:
    a, b = dotted.split(".")
    return float(d[a][b])


# ---- examples --------------------------------------------------------------------------------------------


class OutputWatch:
    """Finds a pattern in the lines a launcher appends to its stdout/stderr files (workers' lines included)."""

    def __init__(self, proc: h.Proc) -> None:
        self.paths = [proc.stdout_path, proc.stderr_path]
        self.offsets = [0, 0]
        self.tails = [b"", b""]

    def seen(self, pattern: re.Pattern[str]) -> bool:
        for i, path in enumerate(self.paths):
            try:
                with open(path, "rb") as f:
                    f.seek(self.offsets[i])
                    chunk = f.read()
            except OSError:
                continue
            self.offsets[i] += len(chunk)
            lines = (self.tails[i] + chunk).split(b"\n")
            self.tails[i] = lines.pop()
            if any(pattern.search(line.decode(errors="replace")) for line in lines):
                return True
        return False


def rank_pid(name: str, d: Path, token: str, rank: int) -> int | None:
    """The pid of ``rank``'s worker: mbr-launch's from its events (a warm standby becomes the rank, so its
    environment does not name it); ft_launcher's from /proc: the process carrying the run's token and
    RANK=rank whose parent does not (its DataLoader workers carry RANK too)."""
    if is_mbr(name):
        starts = [e["pid"] for e in h.read_events(d / "logs") if e["event"] == "worker_start" and e["rank"] == rank]
        return starts[-1] if starts else None
    ranked = set()
    for pid in h.marked_pids(token):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in env:
            ranked.add(pid)
    for pid in sorted(ranked):
        try:
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
        if ppid not in ranked:
            return pid
    return None


def example_trial(name: str, scenario: str, d: Path, args: argparse.Namespace, mbr_path: Path | None) -> dict:
    sc = SCENARIOS[scenario]
    argv = [*launcher_cmd(name), *example_args(d, h.free_port(), VERSION, sc.example, sc.epochs)]
    rec: dict = {"scenario": scenario, "ok": False, "reason": "", "rc": None, "wall": None, "t_fault": None,
                 "load_start": os.getloadavg()[0]}
    with Run(name, argv, d, mbr_path) as run:
        end = run.proc.t0 + args.timeout
        if sc.fault:
            _inject(run, sc, name, d, end, rec)
        run.outcome(rec, run.proc.wait_exit(max(0.0, end - time.monotonic())))
    rec["leftovers"] = run.leftovers
    text = run.text()
    finished = (re.search(rf"CHECK VAL SUMMARY: epoch:\s+{sc.epochs - 1} ", text) is not None
                and "Leaving main, ret_code=0" in text)
    if is_mbr(name):
        events = h.read_events(d / "logs")
        rec["restarts"] = sum(1 for e in events if e["event"] == "restart")
        verdicts = [e for e in events if e["event"] == "verdict"]
        rec["culprit"] = verdicts[0]["culprits"] if verdicts else None
    else:
        rec["restarts"] = len(_FT_RESTART.findall(text))
        timed_out = _FT_TIMEOUT.findall(text)  # the rank whose monitor fired first: the one it kills
        rec["culprit"] = [int(timed_out[0])] if timed_out else None
    rec["ok"] = rec["rc"] == 0 and finished and not rec["reason"]
    if not rec["ok"] and not rec["reason"]:
        what = ("no exit within the timeout" if rec["rc"] is None else f"exit code {rec['rc']}" if rec["rc"]
                else "exit 0 but training did not finish")
        rec["reason"] = h.failure_reason(run.proc, what)
    return rec


def _inject(run: Run, sc: Scenario, name: str, d: Path, end: float, rec: dict) -> None:
    """Rank 1 gets ``sc.fault`` once rank 0 logs a step of epoch ``sc.when`` (what tests/test_nvrx_examples.py
    does, at the moment the script's own --simulated_fault would arm)."""
    watch, trigger = OutputWatch(run.proc), in_epoch(sc.when)
    while time.monotonic() < end and run.proc.poll() is None and not watch.seen(trigger):
        time.sleep(0.05)
    pid = rank_pid(name, d, run.token, 1) if run.proc.poll() is None and time.monotonic() < end else None
    if pid is None:
        rec["reason"] = f"no {sc.fault} sent: rank 0 never reached epoch {sc.when}, or rank 1 was not found"
        return
    os.kill(pid, signal.Signals[sc.fault])
    rec["t_fault"] = time.monotonic() - run.proc.t0


# ---- report ----------------------------------------------------------------------------------------------


def _us(s: h.Summary | None) -> str:
    return "-" if s is None else f"{s.median:.1f} ({s.p25:.1f} / {s.p75:.1f})"


def _paired(by: dict[str, dict[int, float]], name: str) -> str:
    s = h.paired_ratios(by.get(name, {}), by.get(FT, {}))
    return "-" if s is None else f"{s.median:.2f}x ({s.p25:.2f} / {s.p75:.2f})"


def _ratios(by: dict[str, dict[int, float]], names: list[str]) -> list[str]:
    """Per mbr-launch variant: its median / ft_launcher's, and the paired per-trial ratio."""
    sums = {n: h.summarize(list(by.get(n, {}).values())) for n in names}
    return [c for n in names if is_mbr(n) for c in (h.ratio(sums[n], sums.get(FT)), _paired(by, n))]


def _ratio_header(names: list[str]) -> list[str]:
    return [c for n in names if is_mbr(n) for c in (f"{n} / ft: of medians", "paired")]


def render_msgcost(records: list[dict], args: argparse.Namespace) -> list[str]:
    recs = [r for r in records if r.get("phase") == "msgcost"]
    if not recs:
        return []
    names = h.launchers_in(recs, CHOICES)
    rows = []
    for key, label in METRICS:
        by = {n: {r["trial"]: r["values"][key] for r in recs if r["launcher"] == n and r["ok"]} for n in names}
        rows.append([label, *(_us(h.summarize(list(by[n].values()))) for n in names), *_ratios(by, names)])
    ok = ", ".join(f"{n} {sum(r['ok'] for r in recs if r['launcher'] == n)}/{sum(r['launcher'] == n for r in recs)}"
                   for n in names)
    skip = sorted({v for r in recs if r["ok"] for v in r["skip_section_response"]})
    return [f"### Per-message cost of the NVRx 0.7.0 client (`workers/nvrx_msgcost.py`, {args.nproc} ranks)", "",
            f"Each trial: {args.paced} paced calls per kind (one per {args.gap * 1000:g} ms, each timed) and "
            f"{args.burst} back to back, every rank at once, after the launcher side went idle (warm standbys "
            "loaded); a trial's value is the median over its ranks. Monitor CPU: utime + stime over the phase of "
            "the rank monitor process(es), per call of all ranks, read by rank 0 from /proc (10 ms ticks; paced "
            "phases include what the monitor does anyway in that time); cells: median over trials (p25 / p75) in "
            "microseconds; ratios: mbr-launch / ft_launcher 0.7.0 (below 1: mbr-launch cheaper), of the medians and "
            f"paired per trial. Runs that finished: {ok}; the client's `skip_section_response` as the ranks saw "
            f"it: {', '.join(skip) or '-'}.", "",
            h.table(["call", *(f"{n} us" for n in names), *_ratio_header(names)], rows), ""]


def render_examples(records: list[dict]) -> list[str]:
    recs = [r for r in records if r.get("phase") == "examples"]
    if not recs:
        return []
    names = h.launchers_in(recs, CHOICES)
    rows = []
    for scenario in SCENARIOS:
        walls = {n: {r["trial"]: r["wall"] for r in recs if r["scenario"] == scenario and r["launcher"] == n
                     and r["ok"]} for n in names}
        ratios = _ratios(walls, names)
        for n in names:
            mine = [r for r in recs if r["scenario"] == scenario and r["launcher"] == n]
            if not mine:
                continue
            faults = [r["wall"] - r["t_fault"] for r in mine if r["ok"] and r.get("t_fault") is not None]
            culprits = sorted({str(r["culprit"]) for r in mine if r.get("culprit") is not None})
            rows.append([scenario, n, f"{sum(r['ok'] for r in mine)}/{len(mine)}",
                         h.fmt_cell(h.summarize(list(walls[n].values()))),
                         h.fmt_s(statistics.median(faults)) if faults else "-",
                         ", ".join(sorted({str(r.get("restarts")) for r in mine})), ", ".join(culprits) or "-",
                         *(ratios if n == names[0] else [""] * len(ratios))])
    return ["### NVRx 0.7.0's examples, launch -> exit", "",
            "Cells: median (p25 / p75) over the trials that finished; fault -> exit: median; restarts: the values "
            "seen; rank named: mbr-launch's verdict culprits, ft_launcher's first rank monitor to time out (the "
            "rank it kills); ratios: mbr-launch / ft_launcher 0.7.0 wall time (below 1: mbr-launch faster), on "
            "each scenario's first line.", "",
            h.table(["scenario", "launcher", "finished", "wall", "fault -> exit", "restarts", "rank named",
                     *_ratio_header(names)], rows), ""]


def _load_range(records: list[dict]) -> str:
    loads = [r["load_start"] for r in records if "load_start" in r]
    return f"{min(loads):.1f} to {max(loads):.1f}, median {statistics.median(loads):.1f}" if loads else "-"


def render(records: list[dict], args: argparse.Namespace) -> str:
    out = ["## NVRx 0.7.0 client: mbr-launch against ft_launcher 0.7.0, message cost and the 0.7 examples", "",
           *h.machine_lines(gpu=False, mbr_code=args.mbr_code),
           f"- NVRx 0.7.0 from `{nvrx_dir(VERSION).relative_to(h.REPO)}` (the wheel, first on PYTHONPATH for both "
           "launchers); ft_launcher: its console script `.nvrx/0.7.0/bin/ft_launcher`",
           f"- command: `{args.commands or h.command_line()}`",
           f"- load average (1 min) when each run started: {_load_range(records)}", "",
           *render_msgcost(records, args), *render_examples(records)]
    out += h.failure_lines(records, label=lambda r: f"{r['launcher']} {r.get('scenario') or r['phase']} "
                                                      f"trial {r['trial']}")
    return "\n".join(out)


# ---- main ------------------------------------------------------------------------------------------------


def main() -> int:
    parser = h.bench_parser(__doc__, trials=3, choices=CHOICES, default=["mbr-launch", FT], gpu=False,
                            from_raw=True)
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of: {', '.join(PARTS)}")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS),
                        help=f"examples part: comma-separated subset of: {', '.join(SCENARIOS)}")
    parser.add_argument("--paced", type=int, default=2000, help="msgcost: paced calls per kind and rank")
    parser.add_argument("--gap", type=float, default=0.001, help="msgcost: seconds between paced calls")
    parser.add_argument("--burst", type=int, default=20000, help="msgcost: back-to-back calls per kind and rank")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds before a run is killed")
    args = parser.parse_args()
    if args.mbr_baseline:
        parser.error("--mbr-baseline is not supported here: run once per revision (--mbr-source)")
    if args.from_raw:  # give the run's --nproc/--paced/--gap/--burst too: the text quotes them
        return h.render_raw(args, SECTION, lambda records: render(records, args))
    names = h.variant_names(args.launchers, {n: n for n in CHOICES}, CHOICES)
    parts = h.variant_names(args.parts, {p: p for p in PARTS}, PARTS)
    scenarios = h.variant_names(args.scenarios, SCENARIOS, list(SCENARIOS))
    session = h.start(args, "nvrx07")
    steps: list[h.Step] = []
    if "msgcost" in parts:
        steps += h.plan(names, args.trials, phases=["msgcost"])
    if "examples" in parts:
        steps += h.plan([(s, n) for s in scenarios for n in names], args.trials, phases=["examples"])
    counter = iter(range(10**6))

    def one(step: h.Step) -> dict:
        i = next(counter)
        if step.phase == "msgcost":
            name, d = step.item, session.root / f"{i:03d}-{step.item}-msgcost"
            rec = msgcost_trial(name, d, args, session.mbr_path)
        else:
            (scenario, name), d = step.item, session.root / f"{i:03d}-{step.item[1]}-{step.item[0]}"
            rec = example_trial(name, scenario, d, args, session.mbr_path)
        return {"launcher": name, "trial": step.trial, "phase": step.phase, **rec}

    def status(r: dict) -> str:
        if r["phase"] == "msgcost":
            v = r["values"]
            return (f"msgcost: heartbeat {v['heartbeat_paced.median_us']:.1f} us paced, "
                    f"{v['heartbeat_burst.per_call_us']:.1f} us burst; section {v['section_paced.median_us']:.1f} / "
                    f"{v['section_burst.per_call_us']:.1f} us; monitor CPU per call in bursts "
                    f"{v['heartbeat_burst.monitor_cpu_us']:.1f} / {v['section_burst.monitor_cpu_us']:.1f} us")
        return (f"{r['scenario']}: {r['wall']:.1f} s, {r['restarts']} restarts"
                + (f", rank named {r['culprit']}" if r.get("culprit") is not None else ""))

    def failed(r: dict) -> str:
        return f"{r.get('scenario') or r['phase']} FAILED: {r['reason']}"

    done = h.run_trials(args, session, steps, one, status, width=12, failed=failed)
    return h.publish(args, SECTION, render(done.records, args), done.records)


if __name__ == "__main__":
    sys.exit(main())
