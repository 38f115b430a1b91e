"""Run folders (issue 15, finding 8): named by start time and run id, ``<base>/latest`` pointing at the newest,
the last ``--keep-runs`` kept in the default base (and nothing a live run or another tool owns removed), no
empty faulthandler stack files left behind, and standbys named as standbys in ``ps``.

Naming and retention are unit tests on temp folders; one real launch checks ``latest``, the stack files and
the standby's name as ``ps`` and psutil show it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from mbr_launch.config import rundir
from mbr_launch.config.rundir import default_base, make_run_dir, run_folder_name
from testkit.eventlog import read_events

from testkit.helpers import launcher_env, run_launcher

pytestmark = pytest.mark.timeout(60)
DAY = 86400.0
NOW = time.mktime((2026, 12, 1, 0, 15, 2, 0, 0, -1))


@pytest.fixture
def base(tmp_path, monkeypatch):
    """The default base, under a temp dir of this test's; the locks taken by its runs are let go after."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    yield default_base()
    _end_runs()


def _end_runs() -> None:
    """Let go of the locks this process took on the runs it made, as their launchers do when they end."""
    while rundir._held:
        os.close(rundir._held.pop())


def _age(path: Path, seconds: float) -> None:
    """Make ``path`` last changed ``seconds`` before the tests' clock (NOW, which the runs here are made and
    pruned at), not before the machine's: aged from the real time, a run looked changed after NOW once the real
    time passed NOW + 1 day, and was spared (every CI run from 2026-12-02 00:10 UTC on)."""
    then = NOW - seconds
    os.utime(path, (then, then), follow_symlinks=False)


def test_names_start_with_the_start_time_and_sort_by_it(tmp_path):
    name = run_folder_name("../job 7", "node/1", now=NOW)
    assert re.fullmatch(r"20261201-001502__\._job_7_[0-9a-f]{6}_node_1", name), name
    assert rundir.RUN_FOLDER.match(name)
    later = [run_folder_name("zzz", "a", now=NOW + 1), run_folder_name("aaa", "a", now=NOW + 3600)]
    assert sorted([later[1], name, later[0]]) == [name, *later]
    assert run_folder_name("j", "n", now=NOW) != run_folder_name("j", "n", now=NOW)  # two agents of one host
    logs = tmp_path / "logs"  # a --log-dir gets the run folder only: no link, nothing removed
    run_dir = make_run_dir(str(logs), "job", "n1", keep_runs=1, now=NOW)
    make_run_dir(str(logs), "job", "n1", keep_runs=1, now=NOW + 1)
    assert run_dir.name.startswith("20261201-001502_job_") and len(list(logs.iterdir())) == 2


def test_latest_points_at_the_newest_and_old_runs_are_pruned(base):
    runs = [make_run_dir(None, "job", "n1", keep_runs=3, now=NOW + i) for i in range(3)]
    assert os.readlink(base / "latest") == runs[-1].name and (base / "latest" / ".").resolve() == runs[-1]
    _end_runs()
    for run in runs:
        _age(run, DAY)
    foreign = base / "20200101-000000_notes"  # not our pattern: never removed
    foreign.mkdir()
    _age(foreign, DAY)
    newest = make_run_dir(None, "job", "n1", keep_runs=3, now=NOW + 10)
    assert not runs[0].exists() and runs[1].exists() and runs[2].exists() and newest.exists() and foreign.exists()
    assert os.readlink(base / "latest") == newest.name
    assert not [p for p in base.iterdir() if p.name.startswith(".latest")]  # no temporary link left
    assert rundir.prune(base, keep=0) == []  # 0 keeps all


@pytest.mark.processes
def test_retention_spares_runs_in_use_recent_links_and_others(base, tmp_path):
    old = [make_run_dir(None, "job", "n1", now=NOW + i) for i in range(4)]
    # old[0]: a live launcher (another process) holds it
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys, time; fd = os.open(sys.argv[1], "
                               "os.O_RDONLY); fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); "
                               "time.sleep(60)", str(old[0])], stdout=subprocess.PIPE, text=True)
    try:
        _end_runs()
        assert holder.stdout.readline().strip() == "held"
        for run in old[:3]:
            _age(run, DAY)  # old[3]: changed just now (a run that made it and has not locked it yet)
        outside = tmp_path / "outside"
        outside.mkdir()
        planted = base / "20000101-000000_x_abcdef_y"  # our pattern, but a link: never followed
        planted.symlink_to(outside)
        removed = rundir.prune(base, keep=1)
        assert removed == [old[1], old[2]], removed
        assert old[0].exists() and old[3].exists() and outside.exists() and planted.is_symlink()
    finally:
        holder.kill()
        holder.wait()
    assert rundir.prune(base, keep=1) == [old[0]]  # its launcher is gone now


def test_latest_replaces_only_a_link(base, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    base.mkdir(mode=0o700)
    (base / "latest").symlink_to(elsewhere)
    run_dir = make_run_dir(None, "job", "n1", now=NOW)
    assert os.readlink(base / "latest") == run_dir.name and elsewhere.is_dir()  # replaced, not followed
    os.unlink(base / "latest")
    (base / "latest").mkdir()  # no link: left alone
    make_run_dir(None, "job", "n1", now=NOW + 1)
    assert (base / "latest").is_dir() and not (base / "latest").is_symlink()


PS_PROBE = '''\
import json, os, subprocess, sys, time
import psutil
me = psutil.Process()
# The rank's parent: the launcher, or its fork server (mbr_launch.workers.forkserver), which forks the standbys.
parent = me.parent()
launcher = parent.parent() if parent.name() == "mbr-forkserver" else parent
standbys = []
deadline = time.time() + float(sys.argv[2])
while not standbys and time.time() < deadline:  # the agent starts this rank's replacement standby next
    for proc in parent.children():
        try:
            if proc.pid != me.pid and proc.cmdline()[:2] == ["mbr-launch", "standby"]:
                ps = subprocess.run(["ps", "-o", "comm=,args=", "-p", str(proc.pid)], capture_output=True,
                                    text=True).stdout.strip()
                standbys.append({"cmdline": proc.cmdline(), "name": proc.name(), "ps": ps})
        except psutil.Error:
            pass
    time.sleep(0.1)
monitors = []
for proc in launcher.children():
    try:
        if proc.name() == "mbr-monitor":
            monitors.append({"pid": proc.pid, "cmdline": proc.cmdline(), "ppid": proc.ppid()})
    except psutil.Error:
        pass
from mbr_launch.doctor.processes import other_launchers
with open(sys.argv[1], "w") as f:
    json.dump({"standbys": standbys, "monitors": monitors, "launcher": launcher.pid, "parent": parent.name(), "launchers": [(p.pid, " ".join(p.argv)) for p in other_launchers()], "cmdline": me.cmdline(), "orig_argv": sys.orig_argv, "name": me.name()}, f)
'''


@pytest.mark.processes
def test_a_real_run_links_latest_leaves_no_empty_stack_file_and_names_its_standbys_and_monitor(tmp_path):
    script, out, tmp = tmp_path / "probe.py", tmp_path / "seen.json", tmp_path / "tmp"
    script.write_text(PS_PROBE)
    tmp.mkdir()
    # --max-restarts 1: a restart may come, so the agent prepares this rank's replacement standby.
    res = run_launcher(["--standalone", "--nproc-per-node", "1", "--skip-check", "all", "--max-restarts", "1",
                        str(script), str(out), "20"], env=launcher_env(TMPDIR=str(tmp)), timeout=60)
    assert res.returncode == 0, res.stderr[-3000:]
    base = tmp / f"mbr-launch-{os.geteuid()}"
    latest = base / "latest"
    assert latest.is_symlink(), list(base.iterdir())
    run_dir = base / os.readlink(latest)
    assert rundir.RUN_FOLDER.match(run_dir.name) and (run_dir / "events.jsonl").exists()
    events = read_events(run_dir / "events.jsonl")
    assert [e["standby"] for e in events if e["event"] == "worker_start"] == [True]  # the rank was a standby
    # A standby-born rank's /proc/<pid>/environ has no RANK (it was exec'd before its rank was known): the run
    # folder's ranks.json says which pid is which rank.
    [start] = [e for e in events if e["event"] == "worker_start"]
    ranks = json.loads((run_dir / "ranks.json").read_text())
    assert ranks == {"round": 0, "restart_count": 0, "world_size": 1,
                     "ranks": [{"rank": 0, "local_rank": 0, "pid": start["pid"]}]}, ranks
    rank_dir = run_dir / "attempt_0" / "0"
    assert rank_dir.is_dir()
    assert not (rank_dir / "stacks.faulthandler.txt").exists(), sorted(p.name for p in rank_dir.iterdir())
    seen = json.loads(out.read_text())
    assert seen["standbys"], seen
    for standby in seen["standbys"]:
        assert standby["cmdline"][:6] == ["mbr-launch", "standby", "for", "local", "rank", "0:"], standby
        assert standby["name"] == "mbr-standby" and "mbr-launch standby for local rank 0: " in standby["ps"]
        assert standby["ps"].startswith("mbr-standby "), standby
    # ... and the preflight's count of other launchers on the host does not take it for one.
    assert not [pid for pid, cmd in seen["launchers"] if cmd.startswith("mbr-launch standby")], seen["launchers"]
    # The rank monitor, forked from the launcher (monitor.link), is named as the monitor, not as a second
    # launcher (its memory holds the launcher's arguments until it writes its title over them).
    [monitor] = seen["monitors"]
    assert monitor["cmdline"][:1] == ["mbr_launch.monitor.server:"], monitor
    assert " ".join(monitor["cmdline"]).startswith(f"mbr_launch.monitor.server: rank monitor of mbr-launch "
                                                   f"{seen['launcher']}"), monitor
    assert monitor["ppid"] == seen["launcher"], monitor
    assert monitor["pid"] not in [pid for pid, _cmd in seen["launchers"]], seen["launchers"]
    # Once it became the rank, the standby had its worker's command line and name back.
    assert seen["cmdline"] == seen["orig_argv"] and seen["cmdline"][-3:] == [str(script), str(out), "20"], seen
    assert seen["name"] != "mbr-standby", seen


@pytest.mark.processes
def test_no_replacement_standby_is_prepared_when_no_restart_can_use_it(tmp_path):
    """torchrun's default, --max-restarts 0 on a fixed node count: no round can follow, so a replacement standby
    (a process with torch imported, per local rank) would be waste; the rank looks for one for 8 s (the
    replenish delay on few cores is 3 s) and finds none."""
    script, out = tmp_path / "probe.py", tmp_path / "seen.json"
    script.write_text(PS_PROBE)
    res = run_launcher(["--standalone", "--nproc-per-node", "1", "--skip-check", "all", str(script), str(out), "8"],
                       env=launcher_env(), timeout=60)
    assert res.returncode == 0, res.stderr[-3000:]
    seen = json.loads(out.read_text())
    assert seen["standbys"] == [] and seen["monitors"], seen
