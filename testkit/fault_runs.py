"""The machinery of the fault matrix (testkit/fault_cases.py): launch real agents, inject a fault, collect
what came of it. Used by tests/test_fault_matrix.py and benchmarks/bench_faults.py alike, so nothing here
imports pytest.

A scenario gets a ``Ctx`` (its directory and the environment every process it starts must inherit: the
tests' or the bench's session marker, which is how leftover processes are found) and returns a ``Run``:
each agent's exit code, output and events, the wall-clock time the fault was injected, and the processes of a
SIGKILLed agent still alive afterwards (orphans: a bug).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from mbr_launch.report.events import event_time
from testkit.eventlog import read_log_dir

from .helpers import REPO, SCRIPTS

PYTHON = sys.executable
TRAIN = str(SCRIPTS / "train.py")
SLEEPER = str(SCRIPTS / "sleeper.py")
FT_WORKER = str(SCRIPTS / "ft_worker.py")
HANGS = str(SCRIPTS / "hangs.py")
# Every agent of the matrix: no preflight (its checks are not under test here), no status lines.
QUIET = ["--skip-check", "all", "--status", "off"]


class ScenarioError(AssertionError):
    """The scenario itself could not proceed (workers never started, a launcher hung): the case failed."""


@dataclass
class Agent:
    name: str
    popen: subprocess.Popen
    log_dir: Path
    out_path: Path
    err_path: Path
    code: int | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def events(self) -> list[dict]:
        try:
            return read_log_dir(self.log_dir) if self.log_dir.exists() else []
        except ValueError:  # a broken line: log_problem reports it; keep the whole lines
            return [json.loads(line) for p in sorted(self.log_dir.glob("*/events.jsonl"))
                    for line in p.read_text(errors="replace").splitlines() if _whole(line)]

    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace") if self.err_path.exists() else ""

    def stdout(self) -> str:
        return self.out_path.read_text(errors="replace") if self.out_path.exists() else ""

    def worker_pids(self, round_index: int = 0) -> dict[int, int]:
        """rank -> pid of this agent's workers in a round, from its worker_start events."""
        return {e["rank"]: e["pid"] for e in self.events() if e["event"] == "worker_start" and e["round"] == round_index}


@dataclass
class Run:
    """What came of one scenario: per agent (in start order) its exit code, output and events."""
    codes: list[int | None]
    stdout: list[str]
    stderr: list[str]
    events: list[list[dict]]
    t_fault: float | None  # time.time() when the fault was injected (None: no fault time known)
    t_start: float
    t_end: float
    orphans: list[str] = field(default_factory=list)  # processes of a killed agent that outlived it
    cut_logs: list[str] = field(default_factory=list)  # events.jsonl lines that are not whole events
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def all_events(self) -> list[dict]:
        return [e for events in self.events for e in events]

    def tail(self, chars: int = 3000) -> str:
        return "\n".join(f"--- agent {i} (exit {c}) stderr:\n{err[-chars:]}"
                         for i, (c, err) in enumerate(zip(self.codes, self.stderr)))


@dataclass
class Ctx:
    """Where a scenario runs: its directory, the environment for every process, the Slurm cluster if any."""
    tmp: Path
    env: dict[str, str]
    cluster: Any = None  # testkit.slurm_cluster.SlurmCluster for the Slurm cases
    timeout: float = 90.0
    agents: list[Agent] = field(default_factory=list)
    t_start: float = field(default_factory=time.time)
    gone_after: float | None = None  # see kill_agent

    def mbr(self, args: Sequence[str], *, name: str | None = None, env: Mapping[str, str] | None = None,
            prefix: Sequence[str] = (), quiet: bool = True, log_dir: Path | None = None) -> Agent:
        """Start one agent (``python -m mbr_launch``) with its own --log-dir, in its own session."""
        name = name or f"agent{len(self.agents)}"
        log_dir = log_dir or self.tmp / name
        argv = [*prefix, PYTHON, "-m", "mbr_launch", "--log-dir", str(log_dir), *(QUIET if quiet else []), *args]
        return self._start(name, argv, log_dir, env)

    def command(self, argv: Sequence[str], *, name: str, env: Mapping[str, str] | None = None) -> Agent:
        """Any other launcher (torchrun), started like an agent."""
        return self._start(name, list(argv), self.tmp / name, env)

    def _start(self, name: str, argv: list[str], log_dir: Path, env: Mapping[str, str] | None) -> Agent:
        out, err = self.tmp / f"{name}.stdout", self.tmp / f"{name}.stderr"
        with open(out, "wb") as o, open(err, "wb") as e:
            popen = subprocess.Popen(argv, stdout=o, stderr=e, stdin=subprocess.DEVNULL, cwd=REPO,
                                     env={**self.env, **(env or {})}, start_new_session=True)
        agent = Agent(name, popen, log_dir, out, err)
        self.agents.append(agent)
        return agent

    # ---- waiting -------------------------------------------------------------------------------

    def wait_lines(self, path: Path, count: int, timeout: float = 60, *, match: Callable[[str], bool] = bool) -> list[str]:
        """The complete lines of ``path`` once ``count`` of them match; a scenario error if an agent exits
        first or the time runs out."""
        deadline = time.monotonic() + timeout
        while True:
            text = path.read_text() if path.exists() else ""
            lines = [line for line in text.split("\n")[:-1] if match(line)]
            if len(lines) >= count:
                return lines
            ended = [a for a in self.agents if a.popen.poll() is not None]
            if ended or time.monotonic() > deadline:
                why = f"{ended[0].name} exited {ended[0].popen.returncode}" if ended else f"{timeout:g} s passed"
                raise ScenarioError(f"{path.name}: {len(lines)} of {count} lines when {why}\n{self._tails()}")
            time.sleep(0.05)

    def wait_event(self, agent: Agent, event: str, timeout: float = 60, **match: Any) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [e for e in agent.events() if e["event"] == event and all(e.get(k) == v for k, v in match.items())]
            if found:
                return found[0]
            if agent.popen.poll() is not None:
                break
            time.sleep(0.05)
        raise ScenarioError(f"{agent.name}: no {event} event {match or ''}\n{self._tails()}")

    def finish(self, agents: Sequence[Agent] | None = None, timeout: float | None = None) -> None:
        """Wait for the agents to exit; on timeout kill every session this scenario started and fail."""
        deadline = time.monotonic() + (timeout or self.timeout)
        for agent in agents if agents is not None else self.agents:
            try:
                agent.code = agent.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill_all()
                raise ScenarioError(f"{agent.name} did not exit within {timeout or self.timeout:g} s\n"
                                    f"{self._tails()}") from None

    def wait_exit(self, agent: Agent, timeout: float) -> bool:
        """True when the agent exited within ``timeout``; otherwise every session of the scenario is killed."""
        try:
            agent.code = agent.popen.wait(timeout=timeout)
            return True
        except subprocess.TimeoutExpired:
            self.kill_all()
            return False

    def kill_all(self) -> None:
        for agent in self.agents:
            try:
                os.killpg(agent.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            agent.code = agent.popen.wait()

    def _tails(self) -> str:
        return "\n".join(f"--- {a.name} stderr:\n{a.stderr()[-2000:]}" for a in self.agents)

    # ---- faults --------------------------------------------------------------------------------

    def kill_agent(self, agent: Agent, *, grace: float = 3.0) -> tuple[float, list[str]]:
        """SIGKILL an agent; returns (time.time() of the kill, its descendants still alive ``grace`` s
        later). Descendants are taken just before the kill (workers and their children, standbys, the rank
        monitor): nothing of them may survive the agent. ``self.gone_after``: seconds until all were gone."""
        family = descendants(agent.pid)
        t = time.time()
        os.kill(agent.pid, signal.SIGKILL)
        agent.code = agent.popen.wait(timeout=30)
        deadline = t + grace
        while (left := [p for p in family if alive(p)]) and time.time() < deadline:
            time.sleep(0.02)
        self.gone_after = None if left else time.time() - t
        orphans = [f"{p}: {cmdline(p)}" for p in left]
        for pid in left:  # recorded: now clean up, so that one bug does not spill into the next case
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return t, orphans

    def result(self, t_fault: float | None, *, orphans: Sequence[str] = (), **info: Any) -> Run:
        for agent in self.agents:
            if agent.code is None:
                agent.code = agent.popen.poll()
        logs = [p for a in self.agents if a.log_dir.exists() for p in sorted(a.log_dir.glob("*/events.jsonl"))]
        cut = [problem for p in logs if (problem := log_problem(p))]
        return Run(codes=[a.code for a in self.agents], stdout=[a.stdout() for a in self.agents],
                   stderr=[a.stderr() for a in self.agents], events=[a.events() for a in self.agents],
                   t_fault=t_fault, t_start=self.t_start, t_end=time.time(), orphans=list(orphans), cut_logs=cut,
                   info=info)


def _whole(line: str) -> bool:
    try:
        json.loads(line)
        return True
    except ValueError:
        return False


def log_problem(path: Path) -> str:
    """'' when every line of an events.jsonl is a whole JSON object, else what is wrong (a line cut in half
    loses a record: the agent must write whole lines or none)."""
    text = path.read_bytes()
    if text and not text.endswith(b"\n"):
        return f"{path}: the last line is cut in half"
    for number, line in enumerate(text.split(b"\n")[:-1], 1):
        try:
            json.loads(line)
        except ValueError:
            return f"{path}:{number}: not a whole event line"
    return ""


# ---- processes ------------------------------------------------------------------------------------


def descendants(pid: int) -> list[int]:
    """Every live descendant of pid (by parent pid, across sessions)."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(f"/proc/{entry.name}/stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


# ---- timings from events.jsonl ----------------------------------------------------------------------

# Events that show a fault was noticed, in any agent's log.
DETECTING = ("failure", "hang", "verdict", "peer_lost", "monitor_lost", "signal", "preemption")


def detection(run: Run) -> tuple[float, dict] | None:
    """(seconds from the fault to the first event that shows it was noticed, that event)."""
    if run.t_fault is None:
        return None
    recent = [(event_time(e), i, e) for i, e in enumerate(run.all_events) if event_time(e) >= run.t_fault - 1.0]
    seen = sorted(r for r in recent if r[2]["event"] in DETECTING)
    # Nothing but the end (a rendezvous that timed out): the end is when the fault was acted on.
    seen = seen or sorted(r for r in recent if r[2]["event"] == "end" and r[2].get("exit_code"))
    return (seen[0][0] - run.t_fault, seen[0][2]) if seen else None


def recovery(run: Run) -> float | None:
    """Seconds from the fault until every rank of the next round was started again (the last worker_start of
    that round, over every agent); None when no round followed."""
    found = detection(run)
    if found is None or run.t_fault is None:
        return None
    seconds, first = found
    noticed, after = run.t_fault + seconds, first.get("round")
    starts = [e for e in run.all_events if e["event"] == "worker_start" and event_time(e) >= noticed
              and (after is None or e["round"] > after)]
    if not starts:
        return None
    next_round = min(e["round"] for e in starts)
    return max(event_time(e) for e in starts if e["round"] == next_round) - run.t_fault
