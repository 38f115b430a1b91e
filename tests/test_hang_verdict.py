"""The hang verdict names the rank that hung, not the ranks waiting for it (issue #14): real mbr-launch runs
of tests/scripts/hangs.py on CPU (gloo).

In every scenario the culprit goes wrong inside a step, after its heartbeat and its last optimizer step, so
its peers block in that step's all_reduce: all heartbeats stop together and a deadline alone names a rank at
random. The scenarios that share a client and a world size go through one launch, one scenario per attempt, a
restart after each (launched once, by the first of its cases that runs, on one xdist worker); each scenario is
checked twice, on its own round's events:
- ``test_scenario_hangs_as_described``: the script did what the scenario says (the peers' stacks in the
  all_reduce, the culprit's elsewhere); this holds today;
- ``test_verdict_names_the_culprit``: the round's ``verdict`` event, its ``failure`` and its console line name
  the culprit.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from mbr_launch.report.events import event_time
from testkit.eventlog import read_log_dir

from testkit.helpers import SCRIPTS, finish, free_port, launcher_env, run_launcher

HANGS = str(SCRIPTS / "hangs.py")
TIMEOUT = 3.0  # the step / section timeout
pytestmark = [pytest.mark.timeout(300), pytest.mark.processes]


@dataclass(frozen=True)
class Case:
    scenario: str
    client: str = "none"  # none: zero-code --step-timeout; nvrx: RankMonitorClient with section 'step'
    culprit: int = 1
    nproc: int = 2
    frame: str = ""  # a word of the culprit's stack dump that shows where it is stuck

    @property
    def id(self) -> str:
        return f"{self.scenario}-{self.client}-r{self.culprit}of{self.nproc}"

    @property
    def group(self) -> tuple[str, int]:
        """The launch it goes through: one per client and world size."""
        return self.client, self.nproc


CASES = [
    Case("sleep", frame="stuck_in_step"),
    Case("sleep", client="nvrx", frame="stuck_in_step"),
    Case("sigstop", client="nvrx", frame="stuck_in_step"),  # NVRx's own rank_hung fault
    Case("busy", nproc=3, frame="stuck_in_step"),
    Case("dataloader", frame="__getitem__"),
    Case("dataloader", culprit=0, frame="__getitem__"),  # rank 0 as culprit: "first deadline" luck can't pass
    Case("dataloader_workers", client="nvrx", frame="_MultiProcessingDataLoaderIter"),
    Case("other_collective", frame="barrier"),  # the culprit waits too, in a collective its peers never enter
]
GROUPS: dict[tuple[str, int], list[Case]] = {}
for _case in CASES:
    GROUPS.setdefault(_case.group, []).append(_case)


@dataclass(frozen=True)
class Launch:
    rc: int
    stderr: str
    events: list[dict]
    hangs_at: list[float]  # time.time() at which each attempt's culprit started hanging (its hang file)


@dataclass(frozen=True)
class Run:
    """One scenario: its round (attempt) of its group's launch."""
    case: Case
    rc: int  # the launch's
    stderr: str  # the round's console
    events: list[dict]  # the round's events, and the launch's start
    hang_at: float | None


def _timeouts(client: str) -> list[str]:
    if client == "nvrx":
        return ["--heartbeat-timeout", "60", "--section-timeouts", f"step:{TIMEOUT:g}"]
    return ["--step-timeout", f"{TIMEOUT:g}"]


def _hang_time(path: Path) -> float | None:
    return next(iter(_hang_times(path)), None)


def _hang_times(path: Path) -> list[float]:
    lines = path.read_text().split("\n") if path.exists() else []
    return [float(line.split()[2]) for line in lines if line.startswith("hang ")]


def _launch(cases: list[Case], log_dir: Path) -> Launch:
    hang_file = log_dir / "hang"
    client, nproc = cases[0].group
    res = run_launcher(["--standalone", "--nproc-per-node", str(nproc), "--max-restarts", str(len(cases)),
                        "--log-dir", str(log_dir), "--hang-kill-grace", "1", "--skip-check", "all",
                        "--status", "off", *_timeouts(client), HANGS,
                        "--scenario", ",".join(c.scenario for c in cases),
                        "--culprit", ",".join(str(c.culprit) for c in cases), "--client", client,
                        "--hang-step", "20", "--hang-file", str(hang_file)], timeout=100 + 60 * len(cases))
    return Launch(res.returncode, res.stderr, read_log_dir(log_dir), _hang_times(hang_file))


def _round_console(stderr: str, index: int) -> str:
    """The launcher's lines from round ``index``'s start to the next round's."""
    parts = re.split(r"^(?=.*started \d+ workers, .*\(round \d+,)", stderr, flags=re.M)
    starts = [part for part in parts if re.match(rf".*\(round {index},", part.split("\n", 1)[0])]
    return starts[0] if starts else ""


@pytest.fixture(scope="session")
def launches() -> dict[tuple[str, int], Launch]:
    """group -> its launch, made by the first of its cases that runs (in each xdist worker: the cases of a
    group carry one ``xdist_group``, so one worker runs them all and launches the group once)."""
    return {}


@pytest.fixture(params=[pytest.param(c, id=c.id, marks=pytest.mark.xdist_group(f"hang-verdict-{c.client}-{c.nproc}"))
                        for c in CASES])
def run(request, launches, tmp_path_factory) -> Run:
    case: Case = request.param
    group = GROUPS[case.group]
    if case.group not in launches:
        launches[case.group] = _launch(group, tmp_path_factory.mktemp(f"{case.client}-{case.nproc}"))
    launch = launches[case.group]
    index = group.index(case)
    events = [e for e in launch.events if e.get("round") == index or e["event"] == "start"]
    hang_at = launch.hangs_at[index] if index < len(launch.hangs_at) else None
    return Run(case, launch.rc, _round_console(launch.stderr, index), events, hang_at)


def _stack_dumps(events: list[dict]) -> dict[int, str]:
    """rank -> the text of its stack dump (the round's first ``stacks`` event; files are named rank<N>.txt)."""
    stacks = next(e for e in events if e["event"] == "stacks")
    dumps = {}
    for path in stacks["paths"]:
        if path and (m := re.search(r"rank(\d+)\.txt$", path)):
            dumps[int(m.group(1))] = Path(path).read_text()
    return dumps


def _hang_lines(stderr: str) -> list[str]:
    return re.findall(r"^\[mbr-launch [^\]]+\] (HANG: .*)$", stderr, re.M)


def test_scenario_hangs_as_described(run: Run):
    """Not about the verdict: the fault happened, the launcher stopped the round and restarted (the launch
    ends 0 after its fault-free last attempt), and the stacks it dumped show the peers in the all_reduce and
    the culprit where the scenario puts it."""
    case = run.case
    assert run.hang_at is not None, run.stderr[-3000:]
    assert run.rc == 0, run.stderr[-3000:]
    dumps = _stack_dumps(run.events)
    assert sorted(dumps) == list(range(case.nproc)), dumps.keys()
    for rank, text in dumps.items():
        if rank != case.culprit:
            assert "all_reduce" in text, (rank, text)
    assert case.frame in dumps[case.culprit], dumps[case.culprit]
    if case.scenario != "other_collective":
        assert "all_reduce" not in dumps[case.culprit], dumps[case.culprit]


def test_verdict_names_the_culprit(run: Run):
    case = run.case
    others = [r for r in range(case.nproc) if r != case.culprit]
    verdicts = [e for e in run.events if e["event"] == "verdict"]
    assert verdicts, "no verdict event"
    v = verdicts[0]
    assert v["culprits"] == [case.culprit], v
    assert sorted(v["waiting"]) == others, v
    assert v["basis"] != "undetermined" and v["reason"], v
    assert v["nodes"] == [next(e["node"] for e in run.events if e["event"] == "start")], v
    # when the hang started, for the record; how soon the verdict came is a speed (benchmarks/bench_hang.py)
    assert run.hang_at is not None and event_time(v) >= run.hang_at, (event_time(v) - run.hang_at, v)
    failure = next(e for e in run.events if e["event"] == "failure")
    assert (failure["rank"], failure["cause"]) == (case.culprit, "hang"), failure
    assert run.stderr, "no console lines of this round"
    hangs = _hang_lines(run.stderr)
    assert hangs and hangs[0].startswith(f"HANG: rank {case.culprit} "), hangs


def test_crash_cascade_first_exit_is_the_cause(tmp_path):
    """The culprit raises; its peers die of gloo "Connection closed by peer". The first exit is the cause, the
    peers' errors are consequences. The step timeout is not what this test is about, so it is far above a step
    and a crashed rank's exit (which still tears down torch and gloo): with 3 s, once on a loaded 2-core
    machine (CI), a step deadline fired before any rank's exit was recorded, and the first failure was a hang
    with no culprit."""
    res = run_launcher(["--standalone", "--nproc-per-node", "3", "--max-restarts", "0", "--log-dir", str(tmp_path),
                        "--skip-check", "all", "--status", "off", "--step-timeout", "15", HANGS,
                        "--scenario", "crash_cascade", "--culprit", "1", "--hang-step", "20"], timeout=120)
    assert res.returncode == 1, res.stderr[-3000:]
    assert "injected crash" in res.stderr
    events = read_log_dir(tmp_path)
    failures = [e for e in events if e["event"] == "failure"]
    assert failures and (failures[0]["rank"], failures[0]["cause"]) == (1, "crash"), failures
    assert not _hang_lines(res.stderr), res.stderr[-3000:]
    first = re.search(r"^\[mbr-launch [^\]]+\] FAILURE: (.*)$", res.stderr, re.M)
    assert first and first.group(1).startswith("rank 1 "), res.stderr[-3000:]


def test_every_rank_stalled_alike_is_a_job_wide_stall_that_blames_no_rank(tmp_path):
    """Every rank sleeps at the same line outside any collective (a stuck checkpoint write): the first step
    deadline to fire names a rank at random, and rank 0 was blamed, its node charged. The verdict names the
    place, blames no rank, and the job restarts whole."""
    res = run_launcher(["--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--log-dir", str(tmp_path),
                        "--hang-kill-grace", "1", "--skip-check", "all", "--status", "off", *_timeouts("none"), HANGS,
                        "--scenario", "stall_all", "--hang-step", "20"], timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    events = read_log_dir(tmp_path)
    verdicts = [e for e in events if e["event"] == "verdict"]
    assert verdicts and verdicts[0]["basis"] == "job_stall" and verdicts[0]["culprits"] == [], verdicts
    assert "every rank is in `stall_everywhere at" in verdicts[0]["reason"], verdicts[0]
    failure = next(e for e in events if e["event"] == "failure")
    assert (failure["rank"], failure["cause"]) == (-1, "hang"), failure
    assert failure["detail"].startswith("hang, job-wide: every rank is in"), failure
    assert [e["event"] for e in events].count("restart") == 1
    line = re.search(r"^\[mbr-launch [^\]]+\] (HANG, job-wide: .*)$", res.stderr, re.M)
    assert line and "no rank or node to blame" in line.group(1), res.stderr[-3000:]
    assert not _hang_lines(res.stderr), res.stderr[-3000:]  # no "HANG: rank N" line


def test_collective_timeout_of_a_waiting_rank_names_the_sleeping_one(tmp_path):
    """No heartbeat catches the hang first (step timeout 60 s): rank 0 dies of gloo's own 3 s process-group
    timeout while waiting for rank 1, which sleeps. torchrun blames rank 0 here (pytorch#122694)."""
    res = run_launcher(["--standalone", "--nproc-per-node", "2", "--max-restarts", "0", "--log-dir", str(tmp_path),
                        "--hang-kill-grace", "1", "--skip-check", "all", "--status", "off", "--step-timeout", "60",
                        HANGS, "--scenario", "sleep", "--culprit", "1", "--hang-step", "20",
                        "--pg-timeout", f"{TIMEOUT:g}"], timeout=120)
    assert res.returncode == 1, res.stderr[-3000:]
    events = read_log_dir(tmp_path)
    (verdict,) = [e for e in events if e["event"] == "verdict"]
    assert (verdict["culprits"], verdict["waiting"]) == ([1], [0]), verdict
    failure = next(e for e in events if e["event"] == "failure")
    assert (failure["rank"], failure["cause"]) == (1, "hang"), failure
    hangs = _hang_lines(res.stderr)
    assert hangs and hangs[0].startswith("HANG: rank 1 ") and "died of a collective timeout" in hangs[0], hangs


# ---- two agents on this machine (c10d), the culprit on the second ----------------------------------------

def _two_agents(tmp_path: Path, client: str) -> list[tuple[subprocess.Popen, str, str, list[dict]]]:
    port, hang_file = free_port(), tmp_path / "hang"
    procs = []
    for i in range(2):
        cmd = [sys.executable, "-m", "mbr_launch", "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
               "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"verdict{port}", "--max-restarts", "0",
               "--log-dir", str(tmp_path / f"agent{i}"), "--hang-kill-grace", "1", "--skip-check", "all",
               "--status", "off", *_timeouts(client), HANGS, "--scenario", "sleep", "--culprit", "1",
               "--client", client, "--hang-step", "20", "--hang-file", str(hang_file)]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      env=launcher_env(), start_new_session=True))
    done = [(p, *finish(p, 120)) for p in procs]
    return [(p, out, err, read_log_dir(tmp_path / f"agent{i}")) for i, (p, out, err) in enumerate(done)]


def _group_rank(events: list[dict]) -> int:
    return next(e["group_rank"] for e in events if e["event"] == "rendezvous")


# The zero-code client across agents: tests/test_many_agents.py (4 agents, the store host's rank stopped)
@pytest.mark.parametrize("client", ["nvrx"])
def test_two_agents_agree_on_the_culprit_on_the_second(tmp_path, client):
    agents = _two_agents(tmp_path, client)
    for proc, _out, err, events in agents:
        assert proc.returncode == 1, err[-3000:]
        assert any(e["event"] == "rendezvous" for e in events), err[-3000:]
    assert _hang_time(tmp_path / "hang") is not None
    by_group = {_group_rank(events): (err, events) for _p, _o, err, events in agents}
    assert sorted(by_group) == [0, 1]
    culprit_node = next(e["node"] for e in by_group[1][1] if e["event"] == "start")
    for group_rank, (err, events) in by_group.items():
        verdicts = [e for e in events if e["event"] == "verdict"]
        assert verdicts, f"agent {group_rank}: no verdict event"
        v = verdicts[0]
        assert v["culprits"] == [1] and v["nodes"] == [culprit_node], (group_rank, v)
        assert v["group_ranks"] == [1], (group_rank, v)  # the second agent (both run on this one host)
        assert v["waiting"] == [0], (group_rank, v)
        hangs = _hang_lines(err)
        assert hangs and hangs[0].startswith("HANG: rank 1 "), (group_rank, hangs)
    # the failure is recorded where the culprit ran (the other agent's first failure is the verdict's, too)
    failure = next(e for e in by_group[1][1] if e["event"] == "failure")
    assert (failure["rank"], failure["cause"]) == (1, "hang"), failure
