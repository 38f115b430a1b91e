"""Real launches on one node: real worker processes, real gloo, torch's own c10d rendezvous."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from mbr_launch.report.events import read_events, validate

from .helpers import SCRIPTS, finish, launcher_env, run_launcher, start_launcher

TRAIN = str(SCRIPTS / "train.py")
pytestmark = pytest.mark.timeout(120)


def _events(log_dir: Path) -> list[dict]:
    files = list(log_dir.glob("*/events.jsonl"))
    assert len(files) == 1, files
    return read_events(files[0])


def _ready(path: Path) -> list[tuple[int, int]]:
    return sorted((int(r), int(n)) for r, n, _ in (line.split() for line in path.read_text().splitlines()))


def test_standalone_success_prefixes_and_events(tmp_path):
    res = run_launcher(["--standalone", "--nproc-per-node", "2", "--log-dir", str(tmp_path), TRAIN])
    assert res.returncode == 0, res.stderr
    assert "[rank0]:rank 0 ready restart 0 world 2" in res.stdout
    assert "[rank1]:rank 1 done" in res.stdout
    events = _events(tmp_path)
    assert all(not validate(e) for e in events), [validate(e) for e in events]
    names = [e["event"] for e in events]
    assert names[0] == "start" and names[-1] == "end" and "rendezvous" in names
    assert names.count("worker_start") == 2 and events[-1]["exit_code"] == 0


def test_crash_is_restarted_with_a_fresh_round(tmp_path):
    ready = tmp_path / "ready"
    res = run_launcher(["--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--log-dir",
                        str(tmp_path), TRAIN, "--crash-rank", "1", "--ready-file", str(ready)])
    assert res.returncode == 0, res.stderr
    assert _ready(ready) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert "rank 1 (local rank 1)" in res.stderr and "SIGKILL" in res.stderr
    rounds = [e for e in _events(tmp_path) if e["event"] == "rendezvous"]
    assert [r["restart_count"] for r in rounds] == [0, 1]
    assert rounds[0]["master_port"] != rounds[1]["master_port"], "restart reused the master port"


def test_budget_exhausted_exits_1_with_summary(tmp_path):
    res = run_launcher(["--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--log-dir",
                        str(tmp_path), TRAIN, "--exit-rank", "0", "--exit-code", "3"])
    assert res.returncode == 1, res.stderr
    assert "restart budget exhausted" in res.stderr
    assert "mbr-launch failure summary (2 failure(s)" in res.stderr
    assert "rank 0 (local rank 0)" in res.stderr and "exit code 3" in res.stderr
    failures = [e for e in _events(tmp_path) if e["event"] == "failure"]
    assert [(f["rank"], f["exit_code"]) for f in failures] == [(0, 3), (0, 3)]


def test_no_restart_exit_code_ends_the_job(tmp_path):
    res = run_launcher(["--standalone", "--nproc-per-node", "2", "--max-restarts", "3", "--log-dir",
                        str(tmp_path), TRAIN, "--exit-rank", "1", "--exit-code", "17"])
    assert res.returncode == 1
    assert "exit code 17 is not restarted" in res.stderr
    assert len([e for e in _events(tmp_path) if e["event"] == "rendezvous"]) == 1


def test_root_cause_traceback_from_error_file(tmp_path):
    script = tmp_path / "boom.py"
    script.write_text(
        "import os\nfrom torch.distributed.elastic.multiprocessing.errors import record\n"
        "@record\ndef main():\n    if os.environ['RANK'] == '1':\n        raise ValueError('bad shard 42')\n"
        "main()\n")
    res = run_launcher(["--standalone", "--nproc-per-node", "2", str(script)])
    assert res.returncode == 1
    assert "Root cause (first error, rank 1)" in res.stderr
    assert "ValueError: bad shard 42" in res.stderr


def test_redirects_tee_and_filter(tmp_path):
    res = run_launcher(["--standalone", "--nproc-per-node", "2", "--log-dir", str(tmp_path), "-r", "0:1",
                        "-t", "1:1", "--local-ranks-filter", "1", TRAIN])
    assert res.returncode == 0, res.stderr
    assert "[rank0]:" not in res.stdout  # redirected to a file only
    assert "[rank1]:rank 1 done" in res.stdout  # teed
    logs = {p.parent.name: p.read_text() for p in tmp_path.glob("*/attempt_0/*/stdout.log")}
    assert "rank 0 done" in logs["0"] and "rank 1 done" in logs["1"]


def test_module_mode_and_script_args(tmp_path):
    pkg = tmp_path / "pkgmod"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "job.py").write_text("import os, sys\nprint('MOD', __name__, os.environ['RANK'], sys.argv[1:])\n")
    env = launcher_env(PYTHONPATH=str(tmp_path))
    res = run_launcher(["--nproc-per-node", "2", "-m", "pkgmod.job", "--lr", "0.1", "${local_rank}"], env=env)
    assert res.returncode == 0, res.stderr
    assert "[rank0]:MOD __main__ 0 ['--lr', '0.1', '0']" in res.stdout
    assert "[rank1]:MOD __main__ 1 ['--lr', '0.1', '1']" in res.stdout


def test_script_sees_python_semantics(tmp_path):
    script = tmp_path / "sem.py"
    (tmp_path / "sibling.py").write_text("VALUE = 'sibling'\n")
    script.write_text("import sys, sibling\nprint('SEM', __name__, sys.argv, sibling.VALUE, sys.path[0])\n")
    res = run_launcher(["--nproc-per-node", "1", str(script), "a", "--b"])
    assert res.returncode == 0, res.stderr
    assert f"SEM __main__ ['{script}', 'a', '--b'] sibling {tmp_path}" in res.stdout


# ---- signals ------------------------------------------------------------------------------------


def _worker_pids(proc: subprocess.Popen, count: int, timeout: float = 30) -> list[int]:
    import psutil

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        kids = [p for p in psutil.Process(proc.pid).children(recursive=True)
                if "train.py" in " ".join(p.cmdline())]
        if len(kids) >= count:
            return [k.pid for k in kids]
        time.sleep(0.1)
    raise AssertionError("workers did not start")


def _wait_ready(path: Path, count: int, timeout: float = 40) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and len(path.read_text().splitlines()) >= count:
            return
        time.sleep(0.1)
    raise AssertionError("workers never became ready")


def _gone_within(pids: list[int], seconds: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        if not any(_alive(pid) for pid in pids):
            return time.monotonic() - start
        time.sleep(0.02)
    raise AssertionError(f"workers {[p for p in pids if _alive(p)]} still alive after {seconds} s")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 5), (signal.SIGINT, 130)])
def test_signal_is_forwarded_and_reported(tmp_path, sig, code):
    ready, term = tmp_path / "ready", tmp_path / "term"
    proc = start_launcher(["--standalone", "--nproc-per-node", "2", TRAIN, "--steps", "1000",
                           "--step-time", "0.1", "--ready-file", str(ready), "--term-file", str(term)])
    _wait_ready(ready, 2)
    proc.send_signal(sig)
    out, err = finish(proc, 60)
    assert proc.returncode == code, err
    # The workers got the same signal first (SIGINT reaches them as SIGINT: they die by it)
    if sig == signal.SIGTERM:
        assert sorted(term.read_text().split("\n")[:-1]) == ["0 SIGTERM", "1 SIGTERM"]
    assert sig.name in err


def test_sigkill_of_launcher_leaves_no_workers(tmp_path):
    ready = tmp_path / "ready"
    proc = start_launcher(["--standalone", "--nproc-per-node", "2", TRAIN, "--steps", "1000",
                           "--step-time", "0.1", "--ready-file", str(ready)])
    _wait_ready(ready, 2)
    pids = _worker_pids(proc, 2)
    proc.kill()
    proc.communicate(timeout=10)
    _gone_within(pids, 1.0)


def test_unhandled_signal_leaves_no_workers(tmp_path):
    ready = tmp_path / "ready"
    proc = start_launcher(["--standalone", "--nproc-per-node", "2", "--preempt-signals", "SIGTERM", TRAIN,
                           "--steps", "1000", "--step-time", "0.1", "--ready-file", str(ready)])
    _wait_ready(ready, 2)
    pids = _worker_pids(proc, 2)
    proc.send_signal(signal.SIGUSR2)  # handled by nobody: kills the launcher (torchrun orphans workers here)
    proc.communicate(timeout=10)
    assert proc.returncode == -signal.SIGUSR2
    _gone_within(pids, 1.0)


def test_preemption_signal_to_every_process_lets_workers_checkpoint(tmp_path):
    """As under `scancel --signal=USR1`: launcher and workers all get SIGUSR1; the workers must not die of
    it but get SIGTERM from the launcher (their checkpoint signal); the launcher exits 5."""
    ready, term = tmp_path / "ready", tmp_path / "term"
    proc = start_launcher(["--standalone", "--nproc-per-node", "2", TRAIN, "--steps", "1000", "--step-time",
                           "0.1", "--ready-file", str(ready), "--term-file", str(term)])
    _wait_ready(ready, 2)
    pids = _worker_pids(proc, 2)
    for pid in pids:
        os.kill(pid, signal.SIGUSR1)
    time.sleep(0.3)
    assert all(_alive(pid) for pid in pids), "a worker died of SIGUSR1's default action"
    proc.send_signal(signal.SIGUSR1)
    _out, err = finish(proc, 60)
    assert proc.returncode == 5, err
    assert sorted(term.read_text().split("\n")[:-1]) == ["0 SIGTERM", "1 SIGTERM"]
    assert "PREEMPTION (SIGUSR1)" in err


# ---- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize("args,needle", [
    (["--bogus-flag", "x.py"], "No such option: --bogus-flag"),
    (["--nproc-per-node", "2", "/nonexistent/train.py"], "does not exist"),
    (["--nnodes", "3:1", TRAIN], "--nnodes"),
    (["--nnodes", "two", TRAIN], "--nnodes"),
    (["--ft-rank-section-timeouts", "step:abc", TRAIN], "step:abc"),
    ([], "missing the training script"),
    (["--standby-preload", "torch._dynamo,not a module", TRAIN], "'not a module' is not a module name"),
    (["--standby", "off", "--standby-preload", "wave", TRAIN], "--standby-preload needs standbys"),
])
def test_bad_input_one_line_exit_2(args, needle):
    res = run_launcher(args, timeout=30)
    assert res.returncode == 2, (res.returncode, res.stderr)
    assert needle in res.stderr
    assert "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_port_in_use_is_refused(tmp_path):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        res = run_launcher(["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                            "--nproc-per-node", "1", TRAIN], timeout=30)
        res_static = run_launcher(["--master-port", str(port), "--nproc-per-node", "1", TRAIN], timeout=30)
    for r in (res, res_static):
        assert r.returncode == 2, r.stderr
        assert f"port {port}" in r.stderr and "in use" in r.stderr
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
