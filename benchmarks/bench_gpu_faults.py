"""Faults on one GPU, fault -> next optimizer step: mbr-launch beside torchrun and ft_launcher 0.7, in one run
(issue #40). One rank (workers/gpu_fault_train.py: a bf16 MLP) per launch; each launch goes through ``--trials``
faults in a row (``--max-restarts`` as many), one trial per fault, then a clean last attempt.

- ``crash``: the rank holds ``--hold-gib`` (100) GiB; once it has made 20 steps the bench SIGKILLs it. Fault: the
  bench's clock at the kill.
- ``hang``: at its 40th step the rank starts a CUDA kernel that never ends (timeout 10 s: mbr-launch
  ``--step-timeout 10`` with no code in the script, zero-code; ft_launcher ``--ft-rank-heartbeat-timeout 10``
  with the script's NVRx 0.7 heartbeats). Fault: the rank's clock just before the kernel.
- ``stranger``: the hang again, while a process the bench started (not of the job: workers/gpu_stranger.py)
  holds GPU memory (2-3 GB) and keeps a kernel spinning; both fault-tolerant launchers wait for GPU memory
  between rounds (``--ft-gpu-memory-reclaim-timeout`` ``--reclaim``, 20 s here; ft_launcher's default is 50 s)
  with the 512 MB tolerance. What each launcher said about it is quoted.

Next step: the first ``step`` line of a later attempt (``TORCHELASTIC_RESTART_COUNT`` above the faulted one's).
torchrun has no hang detection: a hang trial gives up after ``--torchrun-cap`` s ("never") and ends that launch.
NVRx 0.7 must be importable (PYTHONPATH) for ft_launcher and the ``--nvrx`` heartbeats.

    python benchmarks/bench_gpu_faults.py --trials 3 --out benchmarks/RESULTS.md
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness as h  # noqa: E402

SECTION = "bench_gpu_faults"
WORKER = h.WORKERS / "gpu_fault_train.py"
STRANGER = h.WORKERS / "gpu_stranger.py"
LAUNCHERS = ("mbr-launch", "torchrun", "ft_launcher")
CASES = ("crash", "hang", "stranger")
FT_MAIN = ("import sys; sys.argv[0] = 'ft_launcher'; "
           "from nvidia_resiliency_ext.fault_tolerance.launcher import main; sys.exit(main())")
SAID = {"mbr-launch": re.compile(r"gpu\.strangers|GPU memory|not of this job"),
        "ft_launcher": re.compile(r"GPU memory|gpu_memory|reclaim", re.I), "torchrun": re.compile(r"$^")}


def launch_argv(name: str, case: str, d: Path, args: argparse.Namespace) -> list[str]:
    hang = case != "crash"
    worker = [str(WORKER), "--steps-file", str(d / "steps"), "--mode", "hang" if hang else "crash",
              "--faults", str(args.trials), "--device", args.device, "--hold-gib", str(args.hold_gib if case == "crash" else args.hang_hold_gib)]
    common = ["--standalone", "--nproc-per-node", "1", "--max-restarts", str(args.trials)]
    reclaim = ["--ft-gpu-memory-reclaim-timeout", str(args.reclaim)] if case == "stranger" else []
    if name == "mbr-launch":
        return [sys.executable, "-m", "mbr_launch", *common, "--log-dir", str(d / "logs"),
                *(["--step-timeout", "10"] if hang else []), *reclaim, *worker]
    if name == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", *common, *worker]
    return [sys.executable, "-c", FT_MAIN, *common, "--ft-initial-rank-heartbeat-timeout", "120",
            "--ft-rank-heartbeat-timeout", "10" if hang else "600", *reclaim, *worker, *(["--nvrx"] if hang else [])]


def lines(path: Path) -> list[list[str]]:
    try:
        return [l.split() for l in path.read_text().splitlines() if l.strip()]
    except OSError:
        return []


def wait_for(pred, timeout: float, proc: h.Proc):
    """Poll ``pred`` (None: not yet) every 20 ms until it answers, the launcher exits, or ``timeout`` s pass."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = pred()
        if got is not None:
            return got
        if proc.poll() is not None:
            return pred()
        time.sleep(0.02)
    return None


def one_launch(name: str, case: str, root: Path, args: argparse.Namespace) -> dict:
    token = os.urandom(8).hex()
    d = root / f"{case}-{name}"
    d.mkdir(parents=True)
    steps = d / "steps"
    proc = h.Proc(launch_argv(name, case, d, args), env=h.bench_env(token), out_dir=d, name="launcher")
    rec: dict = {"case": case, "launcher": name, "trials": [], "rc": None, "said": [], "dir": str(d)}
    try:
        for k in range(args.trials):
            started = wait_for(lambda: next((l for l in lines(steps) if l[0] == "start" and int(l[1]) == k), None),
                               args.start_timeout, proc)
            if started is None:
                rec["trials"].append({"trial": k, "seconds": None, "note": f"attempt {k} did not start"})
                break
            if case == "crash":
                steady = wait_for(lambda: True if sum(1 for l in lines(steps) if l[0] == "step" and int(l[1]) == k) >= 20
                                  else None, 60, proc)
                if steady is None:
                    rec["trials"].append({"trial": k, "seconds": None, "note": "no 20 steps"})
                    break
                t_fault = time.time()
                os.kill(int(started[2]), signal.SIGKILL)
            else:
                hung = wait_for(lambda: next((l for l in lines(steps) if l[0] == "hang" and int(l[1]) == k), None),
                                60, proc)
                if hung is None:
                    rec["trials"].append({"trial": k, "seconds": None, "note": "no hang line"})
                    break
                t_fault = float(hung[2])
            cap = args.torchrun_cap if name == "torchrun" and case != "crash" else args.fault_timeout
            nxt = wait_for(lambda: next((l for l in lines(steps) if l[0] == "step" and int(l[1]) > k), None),
                           max(0.0, t_fault + cap - time.time()), proc)
            if nxt is None:
                rec["trials"].append({"trial": k, "seconds": None, "note": f"never (no step within {cap:.0f} s)"})
                break
            rec["trials"].append({"trial": k, "seconds": round(float(nxt[3]) - t_fault, 3)})
        else:
            rec["rc"] = proc.wait_exit(60)
    finally:
        proc.kill_session()
        h.kill_marked(token)
        proc.close()
    err = proc.stderr_path.read_text(errors="replace").splitlines()
    rec["said"] = list(dict.fromkeys(l.strip()[:400] for l in err if SAID[name].search(l)))[:4]
    rec["tail"] = [l[:300] for l in err[-6:]]
    return rec


def start_stranger(root: Path, token: str) -> tuple[h.Proc, int]:
    ready = root / "stranger.ready"
    proc = h.Proc([sys.executable, str(STRANGER), "--ready-file", str(ready)], env=h.bench_env(token),
                  out_dir=root, name="stranger")
    got = wait_for(lambda: next((l for l in lines(ready) if l[0] == "holding"), None), 120, proc)
    if got is None:
        raise SystemExit(f"the stranger did not start: {proc.stderr_tail()}")
    return proc, int(got[1])


def cell(trials: list[dict]) -> str:
    done = [t["seconds"] for t in trials if t["seconds"] is not None]
    never = [t for t in trials if t["seconds"] is None]
    if not done:
        return never[0]["note"] if never else "-"
    text = f"{statistics.median(done):.2f} s ({min(done):.2f}-{max(done):.2f}), {len(done)} trial{'s' * (len(done) > 1)}"
    return text + (f"; then {never[0]['note']}" if never else "")


def ratio(a: list[dict], b: list[dict]) -> str:
    x = [t["seconds"] for t in a if t["seconds"] is not None]
    y = [t["seconds"] for t in b if t["seconds"] is not None]
    if x and not y and b:
        return "b never"
    return f"{statistics.median(x) / statistics.median(y):.2f}x" if x and y else "-"


def report(records: list[dict], args: argparse.Namespace, stranger_pid: int | None) -> str:
    by = {(r["case"], r["launcher"]): r for r in records}
    title = {"crash": f"crash (SIGKILL) while the rank holds {args.hold_gib:g} GiB",
             "hang": "a CUDA kernel that never ends, timeout 10 s",
             "stranger": f"the hang, with a stranger holding GPU memory (reclaim wait {args.reclaim:g} s)"}
    rows = []
    for case in [c for c in args.cases if any(r["case"] == c for r in records)]:
        t = {n: by[(case, n)]["trials"] if (case, n) in by else [] for n in LAUNCHERS}
        rows.append([title[case], *(cell(t[n]) for n in LAUNCHERS),
                     ratio(t["mbr-launch"], t["torchrun"]).replace("b never", "torchrun never"),
                     ratio(t["mbr-launch"], t["ft_launcher"]).replace("b never", "ft_launcher never")])
    out = [f"## Faults on one GPU: fault -> next step, mbr-launch beside torchrun and ft_launcher 0.7 (issue #40)", "",
           *h.machine_lines(gpu=True, mbr_code=args.mbr_code),
           f"- command: `{h.command_line()}`",
           "- one rank (bf16 MLP, 4x4096x4096, AdamW); each launch runs its trials back to back (one fault per "
           "attempt); cells: median (min-max) seconds from the fault to the first optimizer step of the next attempt; "
           "ratios: mbr-launch / the other, of the medians (below 1: mbr-launch faster). NVRx 0.7.0 first on "
           f"PYTHONPATH for all three (so mbr-launch's own reclaim wait is on, as under ft_launcher 0.7: "
           f"--ft-gpu-memory-reclaim-timeout {args.reclaim:g} s in the stranger case, 50 s otherwise).", "",
           h.table(["case", *LAUNCHERS, "mbr / torchrun", "mbr / ft_launcher"], rows), ""]
    if any(r["case"] == "stranger" for r in records):
        out.append(f"What the launchers said in the stranger case (its pid {stranger_pid}):")
        out.append("")
        for n in LAUNCHERS:
            said = by.get(("stranger", n), {}).get("said") or ["(nothing about GPU memory)"]
            out += [f"- {n}: " + " / ".join(f"`{s}`" for s in said)]
        out.append("")
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--launchers", default=",".join(LAUNCHERS))
    p.add_argument("--hold-gib", type=float, default=100.0)
    p.add_argument("--hang-hold-gib", type=float, default=8.0)
    p.add_argument("--reclaim", type=float, default=20.0)
    p.add_argument("--torchrun-cap", type=float, default=20.0)
    p.add_argument("--fault-timeout", type=float, default=90.0)
    p.add_argument("--start-timeout", type=float, default=120.0)
    p.add_argument("--mbr-code", default="the working tree")
    p.add_argument("--device", default="cuda", help="cpu: a smoke test of the bench itself (no stranger case)")
    p.add_argument("--raw", type=Path)
    p.add_argument("--keep", action="store_true", help="keep the trial folders (launcher logs, steps files)")
    p.add_argument("--out", type=Path)
    p.add_argument("--from-raw", type=Path, help="render the report of an earlier run's --raw file")
    args = p.parse_args()
    args.cases = [c for c in args.cases.split(",") if c]
    names = [n for n in args.launchers.split(",") if n]
    if args.from_raw:
        raw = json.loads(args.from_raw.read_text())
        text = report(raw["records"], args, raw.get("stranger_pid"))
        print(text)
        if args.out:
            h.write_section(args.out, SECTION, text)
        return 0
    h.stop_on_sigterm()
    root = Path(os.environ.get("TMPDIR", "/tmp")) / f"mbr-bench-gpu-faults-{os.getpid()}"
    records: list[dict] = []
    stranger_pid = None
    for case in args.cases:
        stranger = None
        token = os.urandom(8).hex()
        if case == "stranger":
            stranger, stranger_pid = start_stranger(root, token)
        try:
            for name in names:
                rec = one_launch(name, case, root, args)
                records.append(rec)
                print(json.dumps({k: rec[k] for k in ("case", "launcher", "trials", "rc", "said")}), flush=True)
                if args.raw:  # after every launch: a run cut short keeps what it measured (--from-raw renders it)
                    args.raw.write_text(json.dumps({"records": records, "stranger_pid": stranger_pid}, indent=1))
        finally:
            if stranger is not None:
                stranger.kill_session()
                h.kill_marked(token)
                stranger.close()
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    text = report(records, args, stranger_pid)
    print("\n" + text)
    if args.out:
        h.write_section(args.out, SECTION, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
