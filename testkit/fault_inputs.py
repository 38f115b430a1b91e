"""Fault scenarios of the launcher's surroundings: a full log disk, bad configuration, a port in use (the
table is testkit/fault_cases.py)."""

from __future__ import annotations

import socket
import subprocess
import time

from .fault_runs import Ctx, Run

# A worker that writes far more than the 64 KiB log disk holds, on both streams.
CHATTY = """import sys
for i in range(3000):
    print(f"line {i} " + "x" * 90, flush=True)
    if i % 10 == 0:
        print(f"err {i} " + "y" * 90, file=sys.stderr, flush=True)
"""


def log_disk_full(ctx: Ctx) -> Run:
    """--log-dir on a 64 KiB tmpfs, --tee 3, two chatty ranks: the logs fill the disk within a second."""
    disk = ctx.tmp / "small"
    disk.mkdir()
    script = ctx.tmp / "chatty.py"
    script.write_text(CHATTY)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)], check=True, timeout=10)
    try:
        t_fault = time.time()
        ctx.mbr(["--standalone", "--nproc-per-node", "2", "--tee", "3", str(script)], log_dir=disk)
        ctx.finish(timeout=30)  # a few seconds when logging survives; on today's main the job never ends
        return ctx.result(t_fault)  # read before the disk goes
    finally:
        ctx.kill_all()
        if subprocess.run(["umount", str(disk)], capture_output=True, timeout=10).returncode != 0:
            subprocess.run(["umount", "-l", str(disk)], capture_output=True, timeout=10)


def check_disk_full(run: Run) -> None:
    """The job's outcome is its workers' (exit 0), one warning says output was lost and how much, and the
    event log holds only whole lines (checked for every case by verify)."""
    err = run.stderr[0]
    assert "internal error" not in err and "Traceback" not in err, err[-3000:]
    warnings = [line for line in err.splitlines() if "WARNING" in line and any(
        word in line.lower() for word in ("lost", "dropped", "no space", "full"))]
    assert warnings, f"no warning about the lost output:\n{err[-3000:]}"


def bad_input(*args: str, config: bytes | None = None):
    """The launcher with bad input: it must refuse at once, in one line, exit 2, starting nothing."""
    def scenario(ctx: Ctx) -> Run:
        extra = list(args)
        if config is not None:
            path = ctx.tmp / "bad.yaml"
            path.write_bytes(config)
            extra = ["--config", str(path), *extra]
        t_fault = time.time()
        ctx.mbr(["--standalone", "--nproc-per-node", "1", *extra, "tests/scripts/train.py"], quiet=False)
        ctx.finish(timeout=30)
        return ctx.result(t_fault, seconds=time.time() - t_fault)
    return scenario


def check_one_line(run: Run, *needles: str) -> None:
    for err in run.stderr:
        assert "Traceback" not in err and "internal error" not in err, err[-3000:]
        assert len(err.strip().splitlines()) == 1, err[-3000:]
        assert all(n in err for n in needles), (needles, err)
    assert not [e for events in run.events for e in events if e["event"] == "worker_start"], "a worker started"


def check_bad_config(run: Run) -> None:
    check_one_line(run)
    assert run.info["seconds"] < 10, f"refused only after {run.info['seconds']:.1f} s"


def port_in_use(ctx: Ctx) -> Run:
    """The c10d endpoint's port, then the static --master-port, held by another process."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        t_fault = time.time()
        c10d = ctx.mbr(["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--nproc-per-node", "1",
                        "tests/scripts/train.py"], quiet=False)
        ctx.finish([c10d], timeout=30)
        static = ctx.mbr(["--master-port", str(port), "--nproc-per-node", "1", "tests/scripts/train.py"], quiet=False)
        ctx.finish([static], timeout=30)
    return ctx.result(t_fault, port=port)


def check_port(run: Run) -> None:
    check_one_line(run, f"port {run.info['port']}", "in use")
