"""Who killed a rank, told as precisely as the node allows and never guessed (``workers.killcause``): the
readers against the kernel's real file formats (mountinfo, /proc/PID/cgroup, cgroup v1 and v2 OOM counters,
/dev/kmsg records), the wording, and real launches: a rank the kernel's OOM killer kills inside a memory
cgroup with a limit (where this machine lets a test make one: root and a writable memory controller; here the
cgroup v1 memory hierarchy), a rank SIGKILLed by someone else, and one our own stop had to SIGKILL."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from mbr_launch.report.exitstatus import ExitStatus, Killer
from mbr_launch.workers import killcause
from mbr_launch.workers.killcause import CgroupMark
from testkit.helpers import LAUNCHER, launcher_env, run_events, run_launcher

pytestmark = pytest.mark.timeout(120)

# A hybrid host (this machine's layout): v1 controllers, the memory one among them, and an empty v2 hierarchy.
MOUNTINFO_HYBRID = """\
22 1 0:20 / /sys/fs/cgroup ro,nosuid,nodev,noexec - tmpfs tmpfs ro,mode=755
25 22 0:23 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
26 22 0:24 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
30 22 0:28 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
CGROUP_HYBRID = "9:name=systemd:/\n4:memory:/slurm/uid_0/job_7/step_0\n1:cpu:/\n0::/\n"
# A container on a v2 host: the cgroup namespace's root is mounted, and /proc/PID/cgroup is relative to it.
MOUNTINFO_V2 = "31 25 0:27 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime - cgroup2 cgroup2 rw,nsdelegate\n"
# A v1 mount whose root is a sub-folder (a bind-mounted job cgroup).
MOUNTINFO_V1_BIND = "40 22 0:23 /slurm/job_7 /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"


def test_the_memory_cgroup_folder_from_mountinfo_and_proc_cgroup():
    assert killcause.candidates(CGROUP_HYBRID, killcause.parse_mounts(MOUNTINFO_HYBRID)) == [
        (Path("/sys/fs/cgroup/memory/slurm/uid_0/job_7/step_0"), "/slurm/uid_0/job_7/step_0"),
        (Path("/sys/fs/cgroup/unified"), "/")]
    assert killcause.candidates("0::/job.slice/train\n", killcause.parse_mounts(MOUNTINFO_V2)) == [
        (Path("/sys/fs/cgroup/job.slice/train"), "/job.slice/train")]
    assert killcause.candidates("4:memory:/slurm/job_7/step_0\n", killcause.parse_mounts(MOUNTINFO_V1_BIND)) == [
        (Path("/sys/fs/cgroup/memory/step_0"), "/step_0")]
    assert killcause.candidates("4:memory:/other\n", killcause.parse_mounts(MOUNTINFO_V1_BIND)) == []


def test_the_oom_kill_count_of_both_cgroup_versions(tmp_path):
    v2, v1, neither = tmp_path / "v2", tmp_path / "v1", tmp_path / "none"
    for d in (v2, v1, neither):
        d.mkdir()
    (v2 / "memory.events").write_text("low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n")
    (v1 / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 5\n")
    assert (killcause.oom_kills(v2), killcause.oom_kills(v1), killcause.oom_kills(neither)) == (2, 5, None)


def _record(seq: int, stamp_s: float, text: str) -> bytes:
    return f"3,{seq},{int(stamp_s * 1e6)},-;{text}\n SUBSYSTEM=x\n".encode()


def test_the_kernels_own_record_names_the_victim_and_old_records_are_not_taken():
    records = [
        _record(1, 100.0, "Memory cgroup out of memory: Killed process 4242 (python) total-vm:323784kB, anon-rss:1kB"),
        _record(2, 5000.0, "oom-kill:constraint=CONSTRAINT_MEMCG,task_memcg=/job,task=python,pid=4242,uid=0"),
        _record(3, 5000.1, "Memory cgroup out of memory: Killed process 4242 (python) total-vm:323784kB, anon-rss:1kB"),
        _record(4, 5000.2, "Out of memory: Killed process 4243 (python) total-vm:1kB"),
    ]
    assert killcause.kernel_record(4242, since=4999.0, records=records) == \
        "Memory cgroup out of memory: Killed process 4242 (python)"
    assert killcause.kernel_record(4242, since=200.0, records=records[:1]) is None  # long before the rank began
    assert killcause.kernel_record(4244, since=0.0, records=records) is None
    assert killcause.kernel_record(4242, since=0.0, records=[b"garbage", b"1,2;Killed process 4242 ("]) is None


MARK = CgroupMark(Path("/x"), "/slurm/job_7", 1)


@pytest.mark.parametrize(("signal_name", "sent", "oom_now", "kernel", "killer", "text"), [
    ("SIGKILL", ["SIGTERM", "SIGKILL"], 1, None, Killer.LAUNCHER, "sent by this launcher's stop after SIGTERM and its grace"),
    ("SIGTERM", ["SIGTERM", "SIGKILL"], 1, None, Killer.LAUNCHER, "sent by this launcher's stop"),
    ("SIGKILL", [], 2, "Out of memory: Killed process 7 (python)", Killer.OOM,
     "the kernel's OOM killer: 'Out of memory: Killed process 7 (python)'"),
    ("SIGKILL", [], 3, None, Killer.OOM, "the kernel's OOM killer: memory cgroup /slurm/job_7 counted 2 OOM kill(s) "
     "while this rank ran (the kernel's log, which names the victim, cannot be read here)"),
    ("SIGKILL", [], 1, None, Killer.UNKNOWN,
     "sender unknown: not this launcher's stop; no OOM kill counted in memory cgroup /slurm/job_7"),
    ("SIGTERM", [], 1, None, Killer.UNKNOWN, "sender unknown: not this launcher's stop"),
])
def test_the_cause_says_what_was_seen(signal_name, sent, oom_now, kernel, killer, text):
    got = killcause.cause(signal_name, sent=sent, started=MARK, oom_now=oom_now, kernel=kernel)
    assert (got.killer, got.text) == (killer, text)


def test_without_a_counter_the_sender_is_unknown_and_faults_keep_their_meaning():
    got = killcause.cause("SIGKILL", sent=[], started=None, oom_now=None, kernel=None)
    assert got.text == "sender unknown: not this launcher's stop; no memory cgroup OOM counter readable here"
    assert killcause.cause("SIGSEGV", sent=[], started=MARK, oom_now=1, kernel=None) is None
    assert killcause.cause(None, sent=[], started=MARK, oom_now=1, kernel=None) is None
    status = ExitStatus.from_returncode(-signal.SIGSEGV)
    assert status.describe() == "SIGSEGV (segmentation fault: a crash in native code (CUDA, NCCL, an extension))"
    assert ExitStatus.from_returncode(-signal.SIGKILL).describe() == "SIGKILL"  # not looked into: no guess


def test_the_ledger_names_the_sender_once_and_forgets_the_worker():
    ledger = killcause.Ledger()
    ledger.sent(5, "SIGTERM", "SIGKILL")
    ledger.sent(5, "SIGKILL")
    got = ledger.settle(5, ExitStatus.from_returncode(-signal.SIGKILL), since=0.0)
    assert got.describe() == "SIGKILL (sent by this launcher's stop after SIGTERM and its grace)"
    assert got.killed_by == "launcher"
    assert ledger.settle(5, ExitStatus.from_returncode(-signal.SIGTERM), since=0.0).killed_by == "unknown"
    assert ledger.settle(6, ExitStatus.from_returncode(3), since=0.0).describe() == "exit code 3"


# ---- real launches ------------------------------------------------------------------------------------------

GROW = """
import time
chunks = []
print("growing", flush=True)
while True:
    chunks.append(bytearray(64 << 20))  # touched: zero-filled pages are charged to the cgroup
    time.sleep(0.01)
"""
SELF_KILL = "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n"
IGNORE_TERM = """
import os, signal, sys, time
if os.environ["LOCAL_RANK"] == "0":
    time.sleep(1.0)
    sys.exit(3)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
time.sleep(60)
"""


def _limited_cgroup(tmp_name: str, limit: int) -> Path | None:
    """A new memory cgroup (v1) under this process's own, with a memory limit; None where the machine does not
    let this test make one."""
    if os.geteuid() != 0:
        return None
    text, mounts = Path("/proc/self/cgroup").read_text(), Path("/proc/self/mountinfo").read_text()
    for folder, _ in killcause.candidates(text, killcause.parse_mounts(mounts)):
        if not (folder / "memory.oom_control").exists():
            continue
        child = folder / tmp_name
        try:
            child.mkdir()
            (child / "memory.limit_in_bytes").write_text(str(limit))
            if (child / "memory.memsw.limit_in_bytes").exists():
                (child / "memory.memsw.limit_in_bytes").write_text(str(limit))  # no swapping out of the OOM
        except OSError:
            _remove(child)
            continue
        return child
    return None


def _remove(cgroup: Path) -> None:
    deadline = time.monotonic() + 10
    while cgroup.exists():
        try:
            cgroup.rmdir()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)  # the last processes are still leaving


def _script(tmp_path: Path, text: str) -> str:
    path = tmp_path / "train.py"
    path.write_text(text)
    return str(path)


def events(logs: Path, name: str) -> list[dict]:
    return [e for e in run_events(logs) if e["event"] == name]


BASE = ["--standalone", "--standby", "off", "--max-restarts", "0", "--skip-check", "all"]


@pytest.mark.processes
def test_a_rank_the_oom_killer_kills_is_named_so(tmp_path):
    cgroup = _limited_cgroup(f"mbr-test-oom-{os.getpid()}", 1536 << 20)
    if cgroup is None:
        pytest.skip("no memory cgroup this test can make here (needs root and a cgroup v1 memory hierarchy)")
    try:
        logs = tmp_path / "logs"
        enter = ["sh", "-c", f'echo $$ > {cgroup}/cgroup.procs && exec "$@"', "sh", *LAUNCHER]
        res = run_launcher([*BASE, "--nproc-per-node", "1", "--log-dir", str(logs), _script(tmp_path, GROW)],
                           launcher=enter, timeout=100)
    finally:
        _remove(cgroup)
    assert res.returncode != 0, res.stderr
    [failure] = events(logs, "failure")
    assert (failure["signal"], failure["killed_by"]) == ("SIGKILL", "oom"), failure
    line = next(l for l in res.stderr.splitlines() if "FAILURE: rank 0" in l)
    assert "SIGKILL (the kernel's OOM killer: " in line, line
    if failure["kill_detail"].startswith("the kernel's OOM killer: '"):  # the kernel's log was readable: its line
        assert f"Killed process {failure['pid']} (" in line, line
    else:
        assert f"memory cgroup /" in line and "counted 1 OOM kill(s)" in line, line


@pytest.mark.processes
def test_a_rank_killed_by_someone_else_is_not_given_a_guessed_cause(tmp_path):
    logs = tmp_path / "logs"
    res = run_launcher([*BASE, "--nproc-per-node", "1", "--log-dir", str(logs), _script(tmp_path, SELF_KILL)],
                       timeout=90)
    assert res.returncode != 0
    [failure] = events(logs, "failure")
    assert (failure["signal"], failure["killed_by"]) == ("SIGKILL", "unknown"), failure
    assert failure["kill_detail"].startswith("sender unknown: not this launcher's stop; "), failure
    assert "out of memory" not in res.stderr and "scheduler" not in res.stderr, res.stderr


@pytest.mark.processes
def test_a_rank_our_stop_had_to_sigkill_is_said_to_be_ours(tmp_path):
    logs = tmp_path / "logs"
    res = run_launcher([*BASE, "--nproc-per-node", "2", "--shutdown-timeout", "1", "--log-dir", str(logs),
                        _script(tmp_path, IGNORE_TERM)], timeout=90)
    assert res.returncode != 0
    exits = {e["local_rank"]: e for e in events(logs, "worker_exit")}
    assert (exits[0]["exit_code"], exits[0]["killed_by"]) == (3, None)
    assert (exits[1]["signal"], exits[1]["killed_by"]) == ("SIGKILL", "launcher"), exits[1]
    assert exits[1]["kill_detail"] == "sent by this launcher's stop after SIGTERM and its grace"
