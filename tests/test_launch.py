"""Real launches on one node: real worker processes, real gloo, torch's own c10d rendezvous."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from testkit.helpers import SCRIPTS, launcher_env, run_events, run_launcher, start_launcher, validate

TRAIN = str(SCRIPTS / "train.py")
pytestmark = [pytest.mark.timeout(120), pytest.mark.processes]


def test_standalone_success_prefixes_and_events(tmp_path):
    res = run_launcher(["--standalone", "--nproc-per-node", "2", "--log-dir", str(tmp_path), TRAIN])
    assert res.returncode == 0, res.stderr
    assert "[rank0]:rank 0 ready restart 0 world 2" in res.stdout
    assert "[rank1]:rank 1 done" in res.stdout
    events = run_events(tmp_path)
    assert all(not validate(e) for e in events), [validate(e) for e in events]
    names = [e["event"] for e in events]
    assert names[0] == "start" and names[-1] == "end" and "rendezvous" in names
    assert names.count("worker_start") == 2 and events[-1]["exit_code"] == 0


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
    # One write per line: print() with several arguments writes them one by one to an unbuffered stream, and
    # partial lines show at once, so another rank's whole line could come between the pieces on a loaded machine.
    (pkg / "job.py").write_text("import os, sys\nprint(f\"MOD {__name__} {os.environ['RANK']} {sys.argv[1:]}\")\n")
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
# A crash, an exit code, SIGTERM/SIGINT/SIGUSR1 to the launcher, its SIGKILL and a port in use are cases of the
# fault matrix (testkit/fault_cases.py), with the assertions that were here.


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
