"""Warm standby workers (``--standby``): real launches, real gloo, real restarts.

Each worker runs a probe that records, at its first line, how it sees the world (pid, process start time,
``sys.argv``, ``__name__``, ``sys.path``, environment, whether torch is already imported), so a standby's
view can be compared with a fresh process's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mbr_launch.workers.standbypool import assigned, mismatched_keys, replenish_delay, standby_env

from testkit.helpers import finish, launcher_env, run_events, run_launcher, start_launcher

pytestmark = [pytest.mark.timeout(120), pytest.mark.processes]

# Written at the top of every probe: nothing may run before it.
PROBE_HEAD = '''\
import json, os, sys, time
_stat = open("/proc/self/stat").read().rsplit(")", 1)[1].split()
RECORD = {"pid": os.getpid(), "torch_preloaded": "torch" in sys.modules, "wave_preloaded": "wave" in sys.modules,
          "dynamo_preloaded": "torch._dynamo" in sys.modules,
          "name": __name__,
          "argv": list(sys.argv), "path": list(sys.path), "cwd": os.getcwd(), "orig_argv": list(sys.orig_argv),
          "env": dict(os.environ), "created": int(_stat[19]) / os.sysconf("SC_CLK_TCK"),
          "nice": (open("/proc/self/autogroup").read().split() or [None])[-1] if os.path.exists("/proc/self/autogroup") else None}
OUT = os.environ.get("PROBE_OUT") or sys.argv[sys.argv.index("--out") + 1]
def save(**extra):
    RECORD.update(extra)
    name = f"{os.environ.get('RANK', 'direct')}.{os.environ.get('TORCHELASTIC_RESTART_COUNT', 0)}.json"
    with open(os.path.join(OUT, name), "w") as f:
        json.dump(RECORD, f)
'''

TRAIN_PROBE = PROBE_HEAD + '''\
import signal
import torch
import torch.distributed as dist
restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
# Nothing but a preload imports wave; a preload still under way at the first line is done by `import torch`.
at_torch = {"wave_at_torch": "wave" in sys.modules, "dynamo_at_torch": "torch._dynamo" in sys.modules}
# After `import torch`: a variable torch._dynamo reads at its import (rank 1, twice), an unrelated one (rank 0);
# then rank 1 uses dynamo (a DDP model or torch.compile imports it), where a fresh process would read it.
for value in ("1", "2"):
    os.environ["TORCHDYNAMO_VERBOSE" if os.environ["RANK"] == "1" else "PROBE_UNRELATED"] = value
if os.environ["RANK"] == "1":
    from torch import _dynamo
else:
    # Hugging Face accelerate's clear-and-restore of os.environ (KwargsHandler.to_kwargs does it), held for
    # longer than any fixed wait after a write would be: nothing changed, nothing to say.
    from accelerate.utils import clear_environment
    with clear_environment():
        time.sleep(0.8)
save(threads=torch.get_num_threads(), **at_torch)
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
if os.path.exists(os.path.join(OUT, "crash")) and dist.get_rank() == 1 and restart == 0:
    # Let the replacements get past their replenish delay (an assignment that comes during it gets a fresh
    # start, nothing preloaded); once they preload, an assignment waits for the preload to finish.
    time.sleep(float(os.environ["PROBE_SETTLE"]))
    with open(os.path.join(OUT, "killed"), "w") as f:
        f.write(str(time.clock_gettime(time.CLOCK_BOOTTIME)))
    os.kill(os.getpid(), signal.SIGKILL)
dist.all_reduce(t)
dist.destroy_process_group()
'''

DYNAMO_WARNING = ("[rank1]:mbr-launch: warm standby: torch._dynamo was imported before this script ran "
                  "(--standby-preload), so TORCHDYNAMO_VERBOSE, set by the script, may have no effect on it; "
                  "set it in the launch environment instead, or run with --standby-preload none")

# A module that configures torch through the environment before importing it.
OMP_PROBE = PROBE_HEAD + '''\
os.environ["OMP_NUM_THREADS"] = "3"
os.environ["KMP_BLOCKTIME"] = "7"
import torch
save(threads=torch.get_num_threads())
'''


def _records(out: Path) -> dict[tuple[str, int], dict]:
    found = {}
    for path in out.glob("*.json"):
        rank, restart, _ = path.name.split(".")
        found[(rank, int(restart))] = json.loads(path.read_text())
    return found


def _launch(tmp_path: Path, name: str, flags: list[str], *, crash: bool = False,
            settle: float | None = None) -> tuple[Path, Path, str]:
    out, logs = tmp_path / name, tmp_path / f"{name}-logs"
    out.mkdir()
    if crash:
        (out / "crash").touch()
    script = tmp_path / "probe.py"
    settle = (0.5 if _can_lower_priority() else replenish_delay(2) + 0.5) if settle is None else settle
    res = run_launcher(["--standalone", "--nproc-per-node", "2", "--log-dir", str(logs), *flags, str(script),
                        "--out", str(out)], env=launcher_env(PROBE_SETTLE=str(settle)))
    assert res.returncode == 0, res.stderr
    return out, logs, res.stderr


def _same_view(warm: dict, fresh: dict, warm_out: Path, fresh_out: Path) -> None:
    """A standby's first line sees what a fresh process's does, up to this run's own values."""
    def norm(value):
        return json.loads(json.dumps(value).replace(str(warm_out), str(fresh_out)))

    for key in ("name", "argv", "path", "cwd", "orig_argv"):
        assert norm(warm[key]) == fresh[key], key
    assert sorted(warm["env"]) == sorted(fresh["env"])
    # Each run has its own ports, run id, log and socket paths.
    differ = {k for k in warm["env"] if warm["env"][k] != fresh["env"][k]
              and k not in ("MASTER_PORT", "PET_MASTER_PORT", "TORCHELASTIC_RUN_ID") and not warm["env"][k].startswith("/")}
    assert not differ, {k: (warm["env"][k], fresh["env"][k]) for k in differ}


def test_standby_preload_imports_more_modules_ahead(tmp_path):
    # --standby-preload wave (a module nothing else imports), torch._dynamo, and one that does not exist:
    # reported on the rank's output, and the job runs on. Modules the user names are imported by every
    # standby: both the first ranks and the restarted ones start with them loaded. Rank 1 sets
    # TORCHDYNAMO_VERBOSE after `import torch` (twice), then imports dynamo: one warning per round on its stderr
    # (round 0's rank 1 is killed later, so the warning comes where dynamo is first used, not at exit), none for
    # rank 0's unrelated variable.
    (tmp_path / "probe.py").write_text(TRAIN_PROBE)
    out, _logs, stderr = _launch(tmp_path, "preload", ["--max-restarts", "1", "--standby-preload",
                                                       "wave,torch._dynamo,no_such_module_mbr"], crash=True)
    records = _records(out)
    assert sorted(records) == [("0", 0), ("0", 1), ("1", 0), ("1", 1)]
    assert all(r["wave_at_torch"] and r["torch_preloaded"] and r["dynamo_at_torch"] for r in records.values()), \
        records
    assert "could not preload no_such_module_mbr (ModuleNotFoundError" in stderr
    assert [line for line in stderr.splitlines() if "TORCHDYNAMO_VERBOSE" in line] == [DYNAMO_WARNING] * 2, stderr
    assert "PROBE_UNRELATED" not in stderr
    assert not [line for line in stderr.splitlines() if line.startswith("[rank0]:") and "set by the script" in line]


def _can_lower_priority() -> bool:
    from mbr_launch.workers.standbypool import autogroup_enabled

    return autogroup_enabled()


def test_a_replacement_warming_at_low_priority_is_taken_at_once_with_its_priority_back(tmp_path):
    # The crash comes at once, while the replacements still import torch at the lowest priority (their
    # session's autogroup at nice 19): they are ahead of a fresh process, so they are taken, get the normal
    # priority back before the script's first line, and finish their preload first.
    if not _can_lower_priority():
        pytest.skip("autogroup scheduling is off here: replacements wait out their delay instead")
    (tmp_path / "probe.py").write_text(TRAIN_PROBE)
    out, logs, _ = _launch(tmp_path, "early", ["--max-restarts", "1", "--standby", "torch"], crash=True, settle=0)
    records = _records(out)
    assert [records[(r, 1)]["torch_preloaded"] for r in ("0", "1")] == [True, True]
    assert [records[(r, k)]["nice"] for r in ("0", "1") for k in (0, 1)] == ["0"] * 4
    starts = [e for e in run_events(logs) if e["event"] == "worker_start"]
    assert [(e["round"], e["standby"]) for e in starts] == [(0, True), (0, True), (1, True), (1, True)]


def test_restart_takes_prestarted_standbys_that_see_what_a_fresh_process_sees(tmp_path):
    (tmp_path / "probe.py").write_text(TRAIN_PROBE)
    warm_out, warm_logs, warm_err = _launch(tmp_path, "warm", ["--max-restarts", "1", "--standby", "torch"],
                                            crash=True)
    fresh_out, fresh_logs, fresh_err = _launch(tmp_path, "fresh", ["--max-restarts", "1", "--standby", "off"])

    warm, fresh = _records(warm_out), _records(fresh_out)
    assert sorted(warm) == [("0", 0), ("0", 1), ("1", 0), ("1", 1)]
    events = run_events(warm_logs)
    starts = [e for e in events if e["event"] == "worker_start"]
    assert [(e["round"], e["standby"]) for e in starts] == [(0, True), (0, True), (1, True), (1, True)]
    assert {e["pid"] for e in starts} == {r["pid"] for r in warm.values()}
    # The restarted ranks are processes that existed before the failure, with torch imported at their start.
    killed = float((warm_out / "killed").read_text())
    for rank in ("0", "1"):
        assert warm[(rank, 1)]["created"] < killed - 0.05, (warm[(rank, 1)]["created"], killed)
    assert all(r["torch_preloaded"] for r in warm.values())
    # The default list (torch._dynamo): the fork server imported it before its first fork, so every rank
    # forked from it has it, in the first round too. A rank that had it and set TORCHDYNAMO_VERBOSE is
    # warned, once.
    assert all(r["dynamo_at_torch"] for r in warm.values())
    warned = [line for line in warm_err.splitlines() if "TORCHDYNAMO_VERBOSE" in line]
    assert warned == [DYNAMO_WARNING] * sum(warm[("1", k)]["dynamo_at_torch"] for k in (0, 1)), warm_err
    assert "PROBE_UNRELATED" not in warm_err

    # Each rank's environment is the round's: its rank, the round's MASTER_PORT, the restart count.
    ports = {e["round"]: e["master_port"] for e in events if e["event"] == "rendezvous"}
    assert ports[0] != ports[1]
    for (rank, restart), record in warm.items():
        env = record["env"]
        assert (env["RANK"], env["LOCAL_RANK"], env["TORCHELASTIC_RESTART_COUNT"]) == (rank, rank, str(restart))
        assert env["MASTER_PORT"] == str(ports[restart]) and env["WORLD_SIZE"] == "2"
        assert env["OMP_NUM_THREADS"] == "1" and record["threads"] == 1
        assert "MBR_STANDBY_FD" not in env
        assert f"attempt_{restart}" in env["TORCHELASTIC_ERROR_FILE"]

    # --standby off: fresh processes, torch not imported before the script's first line.
    assert [e["standby"] for e in run_events(fresh_logs) if e["event"] == "worker_start"] == [False, False]
    assert not any(r["torch_preloaded"] or r["dynamo_preloaded"] for r in fresh.values())
    assert "TORCHDYNAMO_VERBOSE" not in fresh_err  # a fresh process reads it when it imports dynamo itself
    for rank in ("0", "1"):
        _same_view(warm[(rank, 0)], fresh[(rank, 0)], warm_out, fresh_out)
        assert warm[(rank, 0)]["argv"][0] == str(tmp_path / "probe.py")
        assert warm[(rank, 0)]["path"][0] == str(tmp_path)


@pytest.mark.parametrize("level", ["interpreter", "torch"])
def test_module_mode_and_env_set_before_import_torch(tmp_path, level):
    """`python -m` semantics, and a module that sets OMP_NUM_THREADS=3 before `import torch` (the launcher
    sets 1 for 2 ranks), compared with a plain `python -m` run: interpreter imports torch afresh; torch
    re-applies the thread count at the module's `import torch` and warns about what it cannot repair
    (KMP_BLOCKTIME)."""
    pkg = tmp_path / "probes"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "omp.py").write_text(OMP_PROBE)
    out, direct_out = tmp_path / "out", tmp_path / "direct"
    out.mkdir()
    direct_out.mkdir()
    logs = tmp_path / "logs"
    # At torch, also --standby-preload none: nothing beyond the level (not torch._dynamo, the default).
    res = run_launcher(["--standalone", "--nproc-per-node", "2", "--log-dir", str(logs), "--standby", level,
                        *(["--standby-preload", "none"] if level == "torch" else []),
                        "-m", "probes.omp", "--out", str(out)], cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert all(e["standby"] for e in run_events(logs) if e["event"] == "worker_start")
    direct = subprocess.run([sys.executable, "-m", "probes.omp", "--out", str(out)], cwd=tmp_path,
                            env={**launcher_env(), "PROBE_OUT": str(direct_out)},
                            capture_output=True, text=True, timeout=60)
    assert direct.returncode == 0, direct.stderr
    fresh = _records(direct_out)[("direct", 0)]
    for (rank, _), record in _records(out).items():
        # What a fresh import picks (3, or fewer on a machine with fewer physical cores: MKL caps it)
        assert record["threads"] == fresh["threads"] > 1, (level, record["threads"], fresh["threads"])
        assert record["torch_preloaded"] is (level == "torch") and record["dynamo_preloaded"] is False
        assert record["name"] == fresh["name"] == "__main__"
        assert record["argv"] == fresh["argv"] == [str(pkg / "omp.py"), "--out", str(out)]
        assert record["path"] == fresh["path"] and record["path"][0] == str(tmp_path)
        assert record["orig_argv"][-5:] == ["mbr_launch.shim.boot", "-m", "probes.omp", "--out", str(out)]
    warned = "KMP_BLOCKTIME set before `import torch` may have no effect" in res.stderr
    assert warned is (level == "torch"), res.stderr
    assert "OMP_NUM_THREADS set before" not in res.stderr


def test_sigkill_of_launcher_leaves_no_standbys_or_workers(tmp_path):
    import psutil

    script = tmp_path / "wait.py"
    script.write_text("import sys, time\nopen(sys.argv[1] + '.' + __import__('os').environ['RANK'], 'w')\n"
                      "time.sleep(60)\n")
    # --max-restarts 1: a restart may come, so replacement standbys are prepared
    proc = start_launcher(["--standalone", "--nproc-per-node", "2", "--standby", "interpreter", "--max-restarts", "1",
                           str(script), str(tmp_path / "ready")])
    try:
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            # Standbys show the command line they will run: two workers plus two replacement standbys.
            kids = [k for k in psutil.Process(proc.pid).children(recursive=True) if str(script) in k.cmdline()]
            if len(kids) == 4 and len(list(tmp_path.glob("ready.*"))) == 2:
                break
            time.sleep(0.1)
        else:
            raise AssertionError("workers and replacement standbys did not start")
        pids = [k.pid for k in kids]
    finally:
        proc.kill()
        finish(proc, 10)
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline and any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"
                                              for p in pids):
        time.sleep(0.05)
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]
    assert not alive, f"still alive after the launcher was SIGKILLed: {alive}"


def test_unused_standbys_are_killed_on_a_normal_exit(tmp_path):
    """The autouse leftover check covers every test; here the pool is asked directly too."""
    from mbr_launch.workers.standbypool import StandbyPool

    env = {**launcher_env(), "LOCAL_RANK": "0"}
    argv = [sys.executable, "-u", "-m", "mbr_launch.shim.boot", str(tmp_path / "never.py")]
    pool = StandbyPool(level="interpreter", prepare=lambda _lr: (argv, dict(env)))
    pool.fill([0, 1])
    pids = pool.pids()
    assert len(pids) == 2
    pool.close()
    assert not [p for p in pids if os.path.exists(f"/proc/{p}")]


def test_env_matching_rules():
    worker = {"PATH": "/bin", "RANK": "3", "MASTER_PORT": "1234", "OMP_NUM_THREADS": "1",
              "MBR_IGNORE_SIGNALS": "SIGUSR1", "MBR_STACK_FILE": "/x", "TORCHELASTIC_RESTART_COUNT": "0"}
    standby = standby_env(worker)
    assert standby == {"PATH": "/bin", "OMP_NUM_THREADS": "1", "MBR_IGNORE_SIGNALS": "SIGUSR1"}
    assert standby_env({"MBR_TEST_SESSION": "x"}) == {"MBR_TEST_SESSION": "x"}  # markers stay
    assert mismatched_keys(standby, {**worker, "RANK": "5", "MASTER_PORT": "99", "FT_X": "1"}) == []
    assert mismatched_keys(standby, {**worker, "OMP_NUM_THREADS": "4"}) == ["OMP_NUM_THREADS"]
    assert mismatched_keys(standby, {k: v for k, v in worker.items() if k != "PATH"}) == ["PATH"]
    assert all(assigned(k) for k in ("RANK", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "MBR_AUTOBEAT"))
    assert not any(assigned(k) for k in ("LOCAL_RANK", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "PYTHONPATH"))


def test_a_mismatched_environment_falls_back_to_a_fresh_process(tmp_path):
    """A standby started with another OMP_NUM_THREADS is not used (and is killed)."""
    from mbr_launch.workers.standbypool import StandbyPool
    from mbr_launch.workers.process import WorkerSpec

    script = tmp_path / "hello.py"
    script.write_text("print('hello')\n")
    argv = [sys.executable, "-u", "-m", "mbr_launch.shim.boot", str(script)]
    env = {**launcher_env(), "LOCAL_RANK": "0", "OMP_NUM_THREADS": "1"}
    pool = StandbyPool(level="interpreter", prepare=lambda _lr: (argv, dict(env)))
    pool.fill([0])
    (old,) = pool.pids()
    spec = WorkerSpec(local_rank=0, rank=0, argv=argv, env={**env, "OMP_NUM_THREADS": "2"},
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert pool.take(spec) is None
    assert pool.last_miss == "environment differs in OMP_NUM_THREADS"
    assert not os.path.exists(f"/proc/{old}")
    pool.fill([0])
    worker = pool.take(WorkerSpec(**{**spec.__dict__, "env": dict(env)}))
    assert worker is not None and worker.standby_age is not None
    out, _ = worker.proc.communicate(timeout=30)
    assert out == b"hello\n" and worker.proc.returncode == 0
    os.close(worker.pidfd)
    pool.close()


DEFAULT_PRELOAD_PROBE = """\
import os, sys
print("dynamo preloaded:", "torch._dynamo" in sys.modules, flush=True)
import torch
os.environ["PROBE_UNRELATED"] = "1"
for value in ("1", "2"):
    os.environ["TORCHDYNAMO_VERBOSE"] = value
"""


def test_the_default_preload_is_quiet_and_a_warm_standby_warns_about_dynamos_variables(tmp_path):
    """The default list as the launcher passes it (optional: a module that cannot be imported is skipped without
    a word), in a real standby of level torch: once warm, its script starts with torch._dynamo imported, and
    setting TORCHDYNAMO_VERBOSE after `import torch` gets one warning line; the unrelated variable none."""
    from mbr_launch.contract import DEFAULT_PRELOAD
    from mbr_launch.workers.process import WorkerSpec
    from mbr_launch.workers.standbypool import StandbyPool

    script = tmp_path / "dynamo_probe.py"
    script.write_text(DEFAULT_PRELOAD_PROBE)
    argv = [sys.executable, "-u", "-m", "mbr_launch.shim.boot", str(script)]
    env = {**launcher_env(), "LOCAL_RANK": "0", "OMP_NUM_THREADS": "1"}
    pool = StandbyPool(level="torch", prepare=lambda _lr: (argv, dict(env)), optional=True,
                       preload=("no_such_module_mbr", *DEFAULT_PRELOAD["torch"]))
    try:
        # A replacement's way (lowest priority, no hold-off on a loaded host), as the agent promotes it.
        pool.fill([0], background=True)
        deadline = time.monotonic() + 90
        while pool.state(pool._ready[0]) != "warm":
            assert time.monotonic() < deadline, "the standby did not warm up in 90 s"
            pool.promote()
            time.sleep(0.1)
        worker = pool.take(WorkerSpec(local_rank=0, rank=0, argv=argv, env=dict(env), stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE))
        assert worker is not None
        out, err = worker.proc.communicate(timeout=60)
        os.close(worker.pidfd)
    finally:
        pool.close()
    assert (out.decode(), worker.proc.returncode) == ("dynamo preloaded: True\n", 0), err
    assert err.decode().splitlines() == [DYNAMO_WARNING[len("[rank1]:"):]], err  # no_such_module_mbr: quiet


@pytest.mark.skipif(not os.path.exists("/dev/nvidia0"), reason="needs a GPU")
def test_cuda_level_has_a_context_on_local_rank(tmp_path):
    script = tmp_path / "cuda_probe.py"
    script.write_text("import os, sys\npre = 'torch' in sys.modules\nimport torch\n"
                      "print('CUDA', os.environ['LOCAL_RANK'], pre, torch.cuda.is_initialized(), "
                      "torch.cuda.current_device())\n")
    res = run_launcher(["--standalone", "--nproc-per-node", "2", "--standby", "cuda", str(script)])
    assert res.returncode == 0, res.stderr
    assert "[rank0]:CUDA 0 True True 0" in res.stdout and "[rank1]:CUDA 1 True True 1" in res.stdout


def test_replacements_wait_longer_on_few_cores():
    from mbr_launch.workers.standbypool import REPLENISH_DELAY, REPLENISH_DELAY_FEW_CORES, replenish_delay

    assert replenish_delay(2, cpus=2) == REPLENISH_DELAY_FEW_CORES
    assert replenish_delay(8, cpus=128) == REPLENISH_DELAY < REPLENISH_DELAY_FEW_CORES


def test_standbys_hold_off_preloading_on_a_far_oversubscribed_host(monkeypatch):
    import mbr_launch.shim.standby as standby

    monkeypatch.setattr(standby.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(standby, "_running_now", lambda: 3)  # injected too: the real host's count is its load's
    monkeypatch.setattr(standby.os, "getloadavg", lambda: (30.0, 20.0, 10.0))  # 32 agents on 2 cores
    assert standby._saturated()
    monkeypatch.setattr(standby.os, "getloadavg", lambda: (3.0, 2.0, 1.0))  # a busy test machine
    assert not standby._saturated()
    monkeypatch.setattr(standby, "_running_now", lambda: 20)  # a burst the load average has not caught up with
    assert standby._saturated()


def test_the_standby_channel_carries_its_status_pipe_and_reads_the_old_form():
    from mbr_launch.contract import StandbyChannel

    channel = StandbyChannel(7, "torch", 0.5, 9, True)
    assert StandbyChannel.decode(channel.encode()) == channel
    assert StandbyChannel.decode("7:torch:3") == StandbyChannel(7, "torch", 3.0, -1, False)


def test_the_agent_lowers_a_standbys_session_and_raises_it_back():
    """A real process in a session of its own: its autogroup goes to nice 19 and back to 0 from the agent's
    side (skipped where the kernel does not schedule by autogroup)."""
    from mbr_launch.workers.standbypool import _set_priority, autogroup_enabled

    if not autogroup_enabled():
        pytest.skip("autogroup scheduling is off here")
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.readline()"], stdin=subprocess.PIPE,
                            start_new_session=True)
    try:
        group = Path(f"/proc/{proc.pid}/autogroup")
        assert _set_priority(proc.pid, 19) and group.read_text().split()[-1] == "19"
        assert _set_priority(proc.pid, 0) and group.read_text().split()[-1] == "0"
    finally:
        proc.kill()
        proc.wait(10)


def test_replacements_are_promoted_once_warm_or_after_their_low_priority_span():
    """Injected clock, real processes in sessions of their own: a warm replacement gets the normal priority at
    once (its assignment then needs no write), one still warming after LOW_PRIORITY_SPAN too (on a host loaded
    by others it would never warm at nice 19); a first-round standby is never lowered."""
    from types import SimpleNamespace

    from mbr_launch.workers.standbypool import LOW_PRIORITY_SPAN, Standby, StandbyPool, _set_priority, autogroup_enabled

    if not autogroup_enabled():
        pytest.skip("autogroup scheduling is off here")
    procs = [subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.readline()"], stdin=subprocess.PIPE,
                              start_new_session=True) for _ in range(3)]
    try:
        def nice(proc) -> str:
            return Path(f"/proc/{proc.pid}/autogroup").read_text().split()[-1]

        def standby(proc, **kw) -> Standby:
            low = kw.pop("low", True) and _set_priority(proc.pid, 19)
            return Standby(process=SimpleNamespace(pid=proc.pid), channel=-1, env={}, started=100.0,  # type: ignore[arg-type]
                           background=low, low=low, **kw)

        pool = StandbyPool(level="torch", prepare=lambda _lr: None)
        warming, warm, first = standby(procs[0]), standby(procs[1], said=b"w"), standby(procs[2], low=False)
        pool._ready = {0: warming, 1: warm, 2: first}
        pool.promote(now=100.0 + LOW_PRIORITY_SPAN / 2)
        assert (warming.promoted, warm.promoted, first.promoted) == (False, True, False)
        assert [nice(p) for p in procs] == ["19", "0", "0"]
        pool.promote(now=100.0 + LOW_PRIORITY_SPAN)
        assert warming.promoted and nice(procs[0]) == "0"
        assert [pool.state(s) for s in (warming, warm, first)] == ["warming", "warm", "starting"]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(10)


def test_replacements_stay_at_the_lowest_priority_while_the_ranks_start():
    """Issue #38: while this node's ranks start, a warming replacement keeps the lowest priority past
    LOW_PRIORITY_SPAN (the job's own start comes first); once every rank trains, the span runs from then; and
    LOW_PRIORITY_CAP bounds it all."""
    from types import SimpleNamespace

    from mbr_launch.workers.standbypool import (LOW_PRIORITY_CAP, LOW_PRIORITY_SPAN, Standby, StandbyPool,
                                                _set_priority, autogroup_enabled)

    if not autogroup_enabled():
        pytest.skip("autogroup scheduling is off here")
    procs = [subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.readline()"], stdin=subprocess.PIPE,
                              start_new_session=True) for _ in range(2)]
    try:
        def low(proc) -> Standby:
            ok = _set_priority(proc.pid, 19)
            return Standby(process=SimpleNamespace(pid=proc.pid), channel=-1, env={}, started=100.0,  # type: ignore[arg-type]
                           background=ok, low=ok)

        pool = StandbyPool(level="torch", prepare=lambda _lr: None)
        pool.starting()
        waiting = low(procs[0])
        pool._ready = {0: waiting}
        pool.promote(now=100.0 + 10 * LOW_PRIORITY_SPAN)
        assert not waiting.promoted  # the ranks still start
        pool.training(now=150.0)
        pool.promote(now=150.0 + LOW_PRIORITY_SPAN / 2)
        assert not waiting.promoted
        pool.promote(now=150.0 + LOW_PRIORITY_SPAN)
        assert waiting.promoted
        pool.starting()  # the next round: a replacement made now waits again, but never past the cap
        capped = low(procs[1])
        pool._ready = {0: capped}
        pool.promote(now=100.0 + LOW_PRIORITY_CAP - 1)
        assert not capped.promoted
        pool.promote(now=100.0 + LOW_PRIORITY_CAP)
        assert capped.promoted
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(10)


def test_a_standby_whose_priority_cannot_be_given_back_is_not_used(monkeypatch):
    """The host-wide limit on unprivileged autogroup writes refuses the promotion: the rank starts fresh
    instead of running at the lowest priority, and the standby is killed."""
    from mbr_launch.workers import standbypool as standbys
    from mbr_launch.workers.process import WorkerSpec, spawn

    argv = [sys.executable, "-c", "import sys; sys.stdin.readline()"]
    proc = spawn(WorkerSpec(local_rank=0, rank=-1, argv=argv, env=dict(os.environ), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE))
    read_end, write_end = os.pipe()
    try:
        monkeypatch.setattr(standbys, "_set_priority", lambda pid, nice, patience=0.3: False)
        pool = standbys.StandbyPool(level="torch", prepare=lambda _lr: None)
        pool._ready = {0: standbys.Standby(process=proc, channel=write_end, env=dict(os.environ), started=0.0,
                                           background=True, low=True)}
        spec = WorkerSpec(local_rank=0, rank=0, argv=argv, env=dict(os.environ), stdout=None, stderr=None)
        assert pool.take(spec) is None
        assert pool.last_miss == "could not give it the normal priority back"
        assert not proc.alive and proc.status is not None
    finally:
        os.close(read_end)
        if proc.alive:
            proc.proc.kill()
            proc.proc.wait(10)


def test_saturation_counts_the_processes_runnable_now_not_only_the_lagging_average(monkeypatch):
    from mbr_launch.shim import standby as shim

    limit = shim.SATURATED_LOAD_PER_CPU * (os.cpu_count() or 1)
    monkeypatch.setattr(shim.os, "getloadavg", lambda: (0.5, 0.5, 0.5))  # the idle minute before a burst
    monkeypatch.setattr(shim, "_running_now", lambda: int(limit) + 1)
    assert shim._saturated()
    monkeypatch.setattr(shim, "_running_now", lambda: 1)
    assert not shim._saturated()
    monkeypatch.setattr(shim.os, "getloadavg", lambda: (limit + 1, 0.5, 0.5))
    assert shim._saturated()
    monkeypatch.undo()
    assert shim._running_now() >= 1  # this test itself is running
