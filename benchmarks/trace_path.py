"""Which of mbr-launch's modules the agent runs from a fault's detection to the restart (issue #39's count).

One agent, two CPU ranks (gloo), standalone rendezvous. In round 0 rank 1 either sleeps between two optimizer
steps (``--fault hang``, found by the zero-code step deadline) or exits with code 3 (``--fault crash``); round 1
steps a few times and ends. The agent runs under a profile hook on every thread that records each call into a
module of ``mbr_launch`` (which module, on which thread, when). The window:

- hang: from when the agent decoded the rank monitor's expiry (``agent.messages.decode_monitor_event``), less
  the 0.2 s before it on the thread that decoded it (reading that line), to the next round's ``worker_start``;
- crash: from the rank's own last line before its exit to the next round's ``worker_start``.

Counted: the modules called in the window on the agent's main thread and on the thread that saw the fault. Not
counted: the rank monitor's process (it detects hangs, in ``monitor/``) and the agent's background threads
(peer beats, own time), which run whether or not a fault happens. Run it against two trees to compare::

    python benchmarks/trace_path.py --fault hang               # the working tree
    python benchmarks/trace_path.py --fault hang --rev 8c78063  # a git archive of that commit's mbr_launch
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

WORKER = '''
import os, sys, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
rank, restart = dist.get_rank(), int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
w = torch.nn.Parameter(torch.ones(1)); opt = torch.optim.SGD([w], lr=0.0)
for step in range(40 if restart == 0 else 5):
    opt.zero_grad(); (w * 1.0).sum().backward(); dist.all_reduce(w.grad); opt.step(); time.sleep(0.1)
    if restart == 0 and rank == 1 and step == 20:
        with open(os.environ["TRACE_FAULT_FILE"], "w") as f:
            f.write(str(time.time()))
        if sys.argv[1] == "crash":
            os._exit(3)
        time.sleep(3600)
dist.destroy_process_group()
'''


def agent_main(trace_out: str, argv: list[str]) -> None:
    """The agent's own process: profile every call into mbr_launch, dump at the restart's worker_start."""
    calls: list[tuple[float, int, str]] = []
    last: dict[int, str] = {}
    marks: dict[str, float | int] = {}

    def hook(frame, event, _arg):  # type: ignore[no-untyped-def]
        if event == "call":
            mod = frame.f_globals.get("__name__", "")
            tid = threading.get_ident()
            if mod.startswith("mbr_launch") and last.get(tid) != mod:
                last[tid] = mod
                calls.append((time.time(), tid, mod))

    from mbr_launch.agent import messages
    from mbr_launch.report import events

    decode = messages.decode_monitor_event

    def marked_decode(raw):  # type: ignore[no-untyped-def]
        event = decode(raw)
        if isinstance(event, messages.RankExpired) and "expired" not in marks:
            marks["expired"], marks["expired_tid"] = time.time(), threading.get_ident()
        return event

    messages.decode_monitor_event = marked_decode
    for name in ("mbr_launch.agent.lifecycle", "mbr_launch.agent.monitoring"):  # which imports it by name
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(module, "decode_monitor_event"):
            module.decode_monitor_event = marked_decode
    emit = events.EventLog.emit

    def marked_emit(self, event, **fields):  # type: ignore[no-untyped-def]
        record = emit(self, event, **fields)
        if event == "worker_start" and fields.get("restart_count", 0) >= 1 and "restart" not in marks:
            marks["restart"] = time.time()
            Path(trace_out).write_text(json.dumps({"marks": marks, "main": threading.main_thread().ident,
                                                   "calls": calls}))
        return record

    events.EventLog.emit = marked_emit
    threading.setprofile(hook)
    sys.setprofile(hook)
    sys.argv = ["mbr-launch", *argv]
    from mbr_launch.cli.entry import entry

    entry()


def modules_in_window(trace: dict, start: float, start_tid: int | None) -> list[str]:
    end = trace["marks"]["restart"]
    threads = {trace["main"]} | ({start_tid} if start_tid else set())
    lead = 0.2 if start_tid else 0.0
    found: dict[str, float] = {}
    for t, tid, mod in trace["calls"]:
        if tid in threads and start - (lead if tid == start_tid else 0.0) <= t <= end:
            found.setdefault(mod, t)
    return sorted(found, key=found.get)  # type: ignore[arg-type]


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--agent":
        agent_main(sys.argv[2], sys.argv[3:])
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fault", choices=("hang", "crash"), required=True)
    ap.add_argument("--rev", help="run a git archive of this commit's mbr_launch (default: the working tree)")
    ap.add_argument("--timeout", type=float, default=240.0)
    args = ap.parse_args()
    # Here only: the harness puts this checkout first on sys.path, which the agent (run below) must not inherit.
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import harness as h
    from harness.launchers import snapshot

    with tempfile.TemporaryDirectory(prefix="mbr-trace-") as tmp:
        d = Path(tmp)
        code = snapshot(args.rev, d / "src") if args.rev else h.REPO
        (d / "worker.py").write_text(WORKER)
        trace_file, fault_file = d / "trace.json", d / "fault"
        env = {**os.environ, **h.mbr_env(code), "TRACE_FAULT_FILE": str(fault_file)}
        argv = [sys.executable, __file__, "--agent", str(trace_file), "--standalone", "--nproc-per-node", "2",
                "--max-restarts", "1", "--step-timeout", "6", "--status", "off", "--skip-check", "all",
                "--log-dir", str(d / "logs"), str(d / "worker.py"), args.fault]
        proc = subprocess.run(argv, env=env, cwd=d, timeout=args.timeout, capture_output=True, text=True)
        if not trace_file.exists():
            print(f"no restart seen (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
            return 1
        trace = json.loads(trace_file.read_text())
        if args.fault == "hang":
            start, tid = trace["marks"]["expired"], trace["marks"]["expired_tid"]
        else:
            start, tid = float(fault_file.read_text()), None
        mods = modules_in_window(trace, start, tid)
    print(f"{args.fault}: {len(mods)} modules of mbr_launch from detection to the restart's worker_start "
          f"({trace['marks']['restart'] - start:.2f} s; agent exit {proc.returncode}; code from {args.rev or 'the working tree'})")
    for mod in mods:
        print(f"  {mod}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
