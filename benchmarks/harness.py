"""Shared pieces of the launcher benchmarks: who is launched how, processes with deadlines, ready files,
statistics, Markdown, and the RESULTS.md section writer.

Every process a benchmark starts carries ``MBR_BENCH_SESSION=<token>`` in its environment (launchers pass
their environment on to their workers), so cleanup finds the whole tree even when a launcher died and left
orphans in sessions of their own: ``kill_marked`` SIGKILLs every process group and process that carries
the token. Launchers and workers always start in a new session; nothing here signals our own group.

Interleaving: trial i runs the launchers in the order ``rotate(names, i)``, so drift in the machine's load
(other people's tests on 2 shared cores) lands on every launcher alike.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import re
import select
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

REPO = Path(__file__).resolve().parents[1]
WORKERS = REPO / "benchmarks" / "workers"
COLLECTIVE = WORKERS / "collective.py"
MARKER = "MBR_BENCH_SESSION"
BIN = Path(sys.executable).parent


# ---- launchers ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LaunchSpec:
    """What one launch runs: nproc ranks of ``worker`` (argv after the interpreter), logs under log_dir."""
    nproc: int
    max_restarts: int
    worker: list[str]
    log_dir: Path


@dataclass(frozen=True)
class Launcher:
    name: str
    argv: Callable[[LaunchSpec], list[str]]
    env: dict[str, str] = field(default_factory=dict)
    reference: bool = False  # a yardstick (no launcher), left out of ratios
    note: str = ""


def _tool(name: str) -> str:
    path = BIN / name
    return str(path) if path.exists() else (shutil.which(name) or name)


def _mbr(s: LaunchSpec) -> list[str]:
    return [_tool("mbr-launch"), "--standalone", "--nproc-per-node", str(s.nproc), "--max-restarts",
            str(s.max_restarts), "--log-dir", str(s.log_dir), *s.worker]


def _torchrun(s: LaunchSpec) -> list[str]:
    return [_tool("torchrun"), "--standalone", "--nproc-per-node", str(s.nproc), "--max-restarts",
            str(s.max_restarts), *s.worker]


def _ft(s: LaunchSpec) -> list[str]:
    # Heartbeat timeouts far beyond a trial: the workers use no NVRx client, and we measure crashes only.
    return [_tool("ft_launcher"), "--standalone", "--nproc-per-node", str(s.nproc), "--max-restarts",
            str(s.max_restarts), "--ft-initial-rank-heartbeat-timeout", "600", "--ft-rank-heartbeat-timeout",
            "600", *s.worker]


def _bare(s: LaunchSpec) -> list[str]:
    """The ranks started directly by sh with torchrun's variables: the floor for any launcher."""
    port = free_port()
    quoted = " ".join(shlex.quote(a) for a in s.worker)
    starts = "; ".join(
        f"RANK={r} LOCAL_RANK={r} GROUP_RANK=0 {sys.executable} -u {quoted} & p{r}=$!" for r in range(s.nproc))
    waits = "; ".join(f"wait $p{r} || rc=1" for r in range(s.nproc))
    script = (f"export WORLD_SIZE={s.nproc} LOCAL_WORLD_SIZE={s.nproc} MASTER_ADDR=127.0.0.1 "
              f"MASTER_PORT={port} TORCHELASTIC_RESTART_COUNT=0 OMP_NUM_THREADS=1; rc=0; {starts}; {waits}; "
              "exit $rc")
    return ["/bin/sh", "-c", script]


def _import_torch(_s: LaunchSpec) -> list[str]:
    return [sys.executable, "-c", "import torch"]


LAUNCHERS: dict[str, Launcher] = {
    "mbr-launch": Launcher("mbr-launch", _mbr),
    "mbr-launch-dynamo": Launcher("mbr-launch-dynamo", lambda s: [*_mbr(s)[:1], "--standby-preload", "torch._dynamo",
                                                                    *_mbr(s)[1:]],
                                  note="--standby-preload torch._dynamo"),
    "torchrun": Launcher("torchrun", _torchrun, note="default: workers share the rendezvous TCPStore"),
    "torchrun-noshare": Launcher("torchrun-noshare", _torchrun, env={"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"},
                                 note="TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"),
    "ft_launcher": Launcher("ft_launcher", _ft, note="--ft-*-heartbeat-timeout 600"),
    "bare": Launcher("bare", _bare, reference=True, note="ranks started by sh, no launcher"),
    "import-torch": Launcher("import-torch", _import_torch, reference=True, note='python -c "import torch"'),
}
BASELINE, TORCHRUN = "ft_launcher", "torchrun"


def pick_launchers(text: str, allowed: Sequence[str], *, mbr_path: Path | None = None) -> list[Launcher]:
    """The named launchers; with mbr_path, mbr-launch (agent, monitor, worker shim) imports mbr_launch there."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in allowed]
    if bad or not names:
        raise SystemExit(f"--launchers: unknown {bad or 'empty list'}; choose from {', '.join(allowed)}")
    chosen = [LAUNCHERS[n] for n in names]
    if mbr_path is None:
        return chosen
    return [replace(l, env={**l.env, **mbr_env(mbr_path)}) if l.name.startswith("mbr-launch") else l for l in chosen]


def mbr_env(mbr_path: Path | None) -> dict[str, str]:
    """The environment that makes mbr-launch (agent, monitor, worker shim) import mbr_launch from mbr_path
    (a --mbr-source snapshot); empty when the installed code runs."""
    if mbr_path is None:
        return {}
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(mbr_path), os.environ.get("PYTHONPATH", "")) if p)}


def load_raw(paths: Sequence[Path]) -> list[dict]:
    """The trials of several --raw files (earlier runs) for one report; file k's trials are renumbered
    from 1000*k so that runs never share a trial number (paired ratios pair within a run only)."""
    records = []
    for k, path in enumerate(paths):
        for rec in json.loads(Path(path).read_text()):
            rec["trial"] += 1000 * k
            records.append(rec)
    return records


def mbr_source(which: str, root: Path) -> tuple[Path | None, str]:
    """Which mbr_launch code runs: 'head' = a `git archive HEAD` snapshot (other people edit the tree while
    a bench runs), 'tree' = the working tree as it is. Returns (path for PYTHONPATH or None, description)."""
    commit = _run(["git", "rev-parse", "--short", "HEAD"]) or "?"
    if which == "tree":
        dirty = bool(_run(["git", "status", "--porcelain", "--", "mbr_launch"]))
        return None, f"working tree at {commit}" + (" with uncommitted changes" if dirty else "")
    dest = root / "mbr-src"
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", "HEAD", "mbr_launch"], cwd=REPO, capture_output=True, timeout=60,
                             check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True, timeout=60)
    # Byte-compile now, or the first trial pays for it (the live tree's __pycache__ is warm already).
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(dest)], check=True, timeout=120)
    return dest, f"commit {commit} (git archive HEAD snapshot, PYTHONPATH)"


def rotate(items: Sequence, i: int) -> list:
    k = i % len(items) if items else 0
    return [*items[k:], *items[:k]]


def worker_argv(ready_file: Path, *, hold: float, gpu: bool, steps: int = 3) -> list[str]:
    argv = [str(COLLECTIVE), "--ready-file", str(ready_file), "--hold", str(hold), "--steps", str(steps)]
    return [*argv, "--gpu"] if gpu else argv


# ---- processes ------------------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bench_env(token: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)  # each launcher applies its own default
    env.pop("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", None)
    env["PYTHONWARNINGS"] = "ignore"  # pynvml's deprecation warning under ft_launcher, on every start
    env[MARKER] = token
    env.update(extra or {})
    return env


class Proc:
    """One launcher run in its own session; stdout/stderr go to files (no pipes to fill up).

    The working directory is the trial's, never the repository: ``python -m`` puts the working directory
    first on sys.path, which would put the live source tree ahead of a --mbr-source snapshot."""

    def __init__(self, argv: list[str], *, env: dict[str, str], out_dir: Path, name: str) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        self.argv = argv
        self.stdout_path, self.stderr_path = out_dir / f"{name}.stdout", out_dir / f"{name}.stderr"
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.t0_wall = time.time()
            self.t0 = time.monotonic()
            self.popen = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env,
                                          cwd=out_dir, start_new_session=True)
        self.pidfd = os.pidfd_open(self.popen.pid)
        self.t_exit: float | None = None  # monotonic

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    def poll(self) -> int | None:
        if self.popen.returncode is None and self.popen.poll() is not None:
            self.t_exit = time.monotonic()
        return self.popen.returncode

    def wait_exit(self, timeout: float) -> int | None:
        """Wait for the exit with a pidfd (exact exit time, no sleep-poll granularity); None on timeout."""
        if self.poll() is not None:
            return self.returncode
        ready, _, _ = select.select([self.pidfd], [], [], max(0.0, timeout))
        if ready:
            self.t_exit = time.monotonic()
            self.popen.wait()
        return self.returncode

    def kill_session(self) -> None:
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    def close(self) -> None:
        os.close(self.pidfd)

    def stderr_size(self) -> int:
        try:
            return self.stderr_path.stat().st_size
        except OSError:
            return 0

    def stderr_tail(self, lines: int = 8, *, since: int = 0) -> list[str]:
        try:
            with open(self.stderr_path, "rb") as f:
                f.seek(since)
                text = f.read().decode(errors="replace")
        except OSError:
            return []
        return [ln for ln in text.splitlines() if ln.strip()][-lines:]


def marked_pids(token: str) -> list[int]:
    """Live processes (not zombies) whose environment carries our token."""
    needle = f"{MARKER}={token}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            env = Path(f"/proc/{entry.name}/environ").read_bytes()
            state = Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and needle in env.split(b"\0"):
            found.append(int(entry.name))
    return found


def kill_marked(token: str, *, deadline_s: float = 10.0) -> int:
    """SIGKILL every process (and its process group) carrying the token; returns how many were alive."""
    own_group = os.getpgid(0)
    first = marked_pids(token)
    pids, end = first, time.monotonic() + deadline_s
    while pids and time.monotonic() < end:
        for pid in pids:
            try:
                pgid = os.getpgid(pid)
                if pgid != own_group:
                    os.killpg(pgid, signal.SIGKILL)
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.05)
        pids = marked_pids(token)
    return len(first)


class Trial:
    """One launch with cleanup: ``with Trial(...) as t:`` always kills what is left of the launch."""

    def __init__(self, launcher: Launcher, spec_for: Callable[[Path], LaunchSpec], root: Path, index: int):
        self.launcher = launcher
        self.dir = root / f"{index:03d}-{launcher.name}"
        self.dir.mkdir(parents=True)
        self.ready_file = self.dir / "ready"
        self.spec = spec_for(self.dir)
        self.token = uuid.uuid4().hex
        self.proc: Proc | None = None
        self.leftovers = 0  # processes still alive after the launcher itself exited

    def __enter__(self) -> "Trial":
        env = bench_env(self.token, self.launcher.env)
        self.proc = Proc(self.launcher.argv(self.spec), env=env, out_dir=self.dir, name="launcher")
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.proc
        if self.proc.poll() is not None:
            self.leftovers = len(marked_pids(self.token))
        self.proc.kill_session()
        kill_marked(self.token)
        self.proc.close()


def run_to_exit(launcher: Launcher, spec_for: Callable[[Path], LaunchSpec], root: Path, index: int, *,
                timeout: float) -> dict:
    """Launch, wait for the exit: rc, wall time (launch -> exit), ready lines, reason when it failed."""
    rec: dict = {"launcher": launcher.name, "trial": index, "rc": None, "wall": None, "ready": [], "reason": ""}
    with Trial(launcher, spec_for, root, index) as t:
        assert t.proc
        rc = t.proc.wait_exit(timeout)
        rec["rc"], rec["t0_wall"] = rc, t.proc.t0_wall
        rec["ready"] = read_ready(t.ready_file)
        if rc is None:
            rec["reason"] = failure_reason(t.proc, f"hang: no exit within {timeout:.0f} s")
        else:
            assert t.proc.t_exit is not None
            rec["wall"] = t.proc.t_exit - t.proc.t0
            if rc != 0:
                rec["reason"] = failure_reason(t.proc, f"exit code {rc}")
    rec["leftovers"], rec["dir"] = t.leftovers, str(t.dir)
    return rec


# ---- ready files ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Ready:
    rank: int
    restart: int
    time: float
    pid: int


def read_ready(path: Path) -> list[Ready]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 5 and parts[0] == "ready":
            out.append(Ready(int(parts[1]), int(parts[2]), float(parts[3]), int(parts[4])))
    return out


def ready_ranks(path: Path, restart: int) -> dict[int, Ready]:
    return {r.rank: r for r in read_ready(path) if r.restart == restart}


def wait_ready(proc: Proc, path: Path, *, restart: int, nproc: int, timeout: float,
               poll: float = 0.01) -> tuple[str, dict[int, Ready]]:
    """('ready'|'exited'|'timeout', ranks seen) -- exited: the launcher ended before every rank was ready."""
    end = time.monotonic() + timeout
    while True:
        seen = ready_ranks(path, restart)
        if len(seen) >= nproc:
            return "ready", seen
        if proc.poll() is not None:
            return "exited", ready_ranks(path, restart)
        if time.monotonic() >= end:
            return "timeout", seen
        time.sleep(poll)


# ---- failure reasons ------------------------------------------------------------------------------------

# What a failed launch's stderr says, most specific first. "Connection reset/closed by peer" is left out: the
# surviving rank prints it after every kill, with every launcher, so it names no failure of the restart.
REASONS: list[tuple[str, str]] = [
    (r"connectFullMesh failed", "Gloo connectFullMesh failed"),
    (r"Connection refused", "connection refused"),
    (r"DistStoreError|Socket Timeout|Timed out after", "store timeout"),
    (r"RendezvousTimeoutError|RendezvousClosedError|RendezvousError", "rendezvous error"),
    (r"Address already in use|EADDRINUSE", "address in use"),
]


def classify(stderr_lines: Sequence[str]) -> tuple[str, str]:
    """(label, the line that says it) for the most specific known error; else ('', last error-like line)."""
    for pattern, label in REASONS:
        for line in stderr_lines:
            if re.search(pattern, line):
                return label, line.strip()
    errorish = [ln for ln in stderr_lines if re.search(r"Error|error:|failed|FAILED|Exception|Killed|SIG[A-Z]+", ln)
                and not re.search(r"To enable traceback|elastic/errors.html", ln)]
    wordy = [ln for ln in stderr_lines if re.search(r"[A-Za-z]{3}", ln) and "elastic/errors.html" not in ln]
    return "", (errorish or wordy or [""])[-1].strip()


def failure_reason(proc: Proc, what: str, *, since: int = 0) -> str:
    """One line: what went wrong, the recognised error, and the stderr line that shows it (stderr from byte
    ``since`` on, e.g. only what came after the kill)."""
    label, line = classify(proc.stderr_tail(400, since=since))
    return "; ".join(p for p in (what, label, f"stderr: {line[:200]}" if line else "") if p)


# ---- statistics and Markdown ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Summary:
    n: int
    median: float
    p25: float
    p75: float


def summarize(values: Sequence[float]) -> Summary | None:
    vals = sorted(values)
    if not vals:
        return None
    if len(vals) == 1:
        return Summary(1, vals[0], vals[0], vals[0])
    q = statistics.quantiles(vals, n=4, method="inclusive")
    return Summary(len(vals), statistics.median(vals), q[0], q[2])


def fmt_s(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f} s"


def fmt_iqr(s: Summary | None) -> str:
    return "-" if s is None else f"{s.p25:.3f} / {s.p75:.3f}"


def ratio(a: Summary | None, b: Summary | None) -> str:
    if a is None or b is None or b.median <= 0:
        return "-"
    return f"{a.median / b.median:.2f}x"


def paired_ratios(a: dict[int, float], b: dict[int, float]) -> Summary | None:
    """Per-trial a/b over trials where both succeeded (same trial = same machine load)."""
    return summarize([a[i] / b[i] for i in sorted(a.keys() & b.keys()) if b[i] > 0])


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _run(argv: list[str], timeout: float = 30) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=REPO).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def meminfo_gib() -> str:
    try:
        kb = int(next(l.split()[1] for l in Path("/proc/meminfo").read_text().splitlines()
                      if l.startswith("MemTotal")))
        return f"{kb / 2**20:.1f} GiB"
    except (OSError, StopIteration, ValueError):
        return "?"


def machine_lines(*, gpu: bool, mbr_code: str) -> list[str]:
    lines = [
        f"- date: {_run(['date', '-u']) or datetime.now(timezone.utc).isoformat()}",
        f"- machine: `{_run(['uname', '-a']) or platform.platform()}`; {os.cpu_count()} CPUs (nproc "
        f"{_run(['nproc'])}), {meminfo_gib()} memory; load average at start {os.getloadavg()[0]:.2f}",
        f"- python {platform.python_version()}, torch {_version('torch')}, nvidia-resiliency-ext "
        f"{_version('nvidia-resiliency-ext')}, mbr-launch {_version('mbr-launch')}: {mbr_code}",
    ]
    if gpu:
        gpus = _run(["nvidia-smi", "-L"]).splitlines()
        lines.append(f"- backend: nccl; GPUs: {'; '.join(gpus) or 'none found'}")
    else:
        lines.append("- backend: gloo on CPU")
    return lines


def command_line() -> str:
    return "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(sys.argv[0], REPO), *sys.argv[1:]])


def write_section(path: Path, name: str, body: str) -> None:
    """Replace the ``<!-- name:start -->`` ... ``<!-- name:end -->`` block of path, or append one."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    block = f"{start}\n{body.rstrip()}\n{end}"
    text = path.read_text() if path.exists() else "# Benchmark results\n\nWritten by the scripts in `benchmarks/`" \
        " (see benchmarks/README.md); each script replaces only its own section.\n"
    if start in text and end in text:
        before, rest = text.split(start, 1)
        after = rest.split(end, 1)[1]
        text = before + block + after
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text)


# ---- command line ---------------------------------------------------------------------------------------

def common_args(parser: argparse.ArgumentParser, *, trials: int, launchers: Sequence[str]) -> None:
    parser.add_argument("--trials", type=int, default=trials, help="trials per launcher (interleaved)")
    parser.add_argument("--launchers", default=",".join(launchers),
                        help=f"comma-separated subset of: {', '.join(launchers)}")
    parser.add_argument("--gpu", action="store_true", help="nccl on cuda:LOCAL_RANK instead of gloo on CPU")
    parser.add_argument("--nproc", type=int, default=2, help="ranks per launch")
    parser.add_argument("--out", type=Path, default=None, help="write/replace this bench's section in FILE")
    parser.add_argument("--raw", type=Path, default=None, help="write every trial as JSON to FILE")
    parser.add_argument("--keep", action="store_true", help="keep the per-trial logs (path printed)")
    parser.add_argument("--mbr-source", choices=["head", "tree"], default="head",
                        help="mbr_launch code to run: a snapshot of HEAD (default) or the working tree as is")


def stop_on_sigterm() -> None:
    """SIGTERM (e.g. from `timeout`) unwinds like Ctrl-C, so every open Trial kills its processes."""
    def handler(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, handler)


def interleave(items: Sequence, trials: int, run: Callable[[Any, int], dict], status: Callable[[dict], str], *,
               root: Path, keep: bool, raw: Path | None = None, first: int = 0) -> list[dict]:
    """Trial i runs every item once, in an order rotated by i; prints a status line per run and keeps the raw
    records after each (a run cut short keeps what it measured). Ctrl-C/SIGTERM stop early with the records so
    far; the trial directories under root are removed at the end unless keep."""
    records: list[dict] = []
    try:
        for i in range(first, first + trials):
            for item in rotate(items, i):
                rec = run(item, i)
                records.append(rec)
                write_raw(raw, records)
                ok = rec.get("ok", True)
                print(f"[{i + 1}/{first + trials}] {rec.get('launcher', ''):21s} "
                      + (status(rec) if ok else f"FAILED: {rec.get('reason', '')}"), flush=True)
    except KeyboardInterrupt:
        print("interrupted: reporting the trials so far", file=sys.stderr)
    finally:
        finish_dir(root, keep)
    return records


def work_dir(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=f"mbr-bench-{prefix}-"))


def finish_dir(root: Path, keep: bool) -> None:
    if keep:
        print(f"trial logs kept in {root}", file=sys.stderr)
    else:
        shutil.rmtree(root, ignore_errors=True)


def write_raw(path: Path | None, records: list[dict]) -> None:
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(records, indent=1, default=str))


def parse_ts(ts: str) -> float:
    return datetime.fromisoformat(ts).timestamp()


def read_events(log_dir: Path) -> list[dict]:
    """The records of mbr-launch's events.jsonl under log_dir (one run per log_dir)."""
    out = []
    for path in sorted(log_dir.glob("*/events.jsonl")):
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return out


def publish(args: argparse.Namespace, section: str, text: str, records: list) -> int:
    """Print a bench's report, keep its raw trials (--raw) and write its RESULTS.md section (--out)."""
    print("\n" + text)
    write_raw(args.raw, records)
    if args.out:
        write_section(args.out, section, text)
    return 0


def failure_lines(records: list[dict]) -> list[str]:
    """The report's lines about failed trials and processes a launcher left behind (none when clean)."""
    out: list[str] = []
    failures = [r for r in records if not r["ok"]]
    if failures:
        out += ["Failed trials:", ""] + [f"- {r['launcher']} trial {r['trial']}: {r['reason']}" for r in failures]
        out.append("")
    left = [r for r in records if r.get("leftovers")]
    if left:
        out += ["Processes still alive after the launcher exited (killed by the harness): " + "; ".join(
            f"{r['launcher']} trial {r['trial']}: {r['leftovers']}" for r in left) + ".", ""]
    return out


def variant_names(spec: str, variants: Mapping, choices: Sequence[str]) -> list[str]:
    """``--launchers a,b`` checked against a bench's own variants; a clear exit on an unknown name."""
    names = [n.strip() for n in spec.split(",") if n.strip()]
    bad = [n for n in names if n not in variants]
    if bad or not names:
        raise SystemExit(f"--launchers: unknown {bad or 'empty list'}; choose from {', '.join(choices)}")
    return names
