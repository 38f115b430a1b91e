"""ft_launcher's restart-policy tables (NVRx's functional tests of ``--ft-restart-policy``), run step by step
with real agents on this machine: mbr-launch's or ft_launcher's, each agent a node of 1-2 CPU ranks of the
counting worker (tests/scripts/counting_worker.py), one c10d rendezvous with ``--nnodes MIN:MAX``.

A step starts agents or ends one with a plain SIGTERM, then the job's runs (rank 0 starts), live ranks and
live agents are asserted. Where something must happen (a restart), the step waits until the counts are the
expected ones; where nothing may (``quiet``), it first waits for the step's cause (the agent gone, the new
agent listed in torch's rendezvous state), then lets the other agents react for ``SETTLE`` seconds before
it asserts that the counts did not move. Nothing here asserts a speed: every wait is for a state.
"""

from __future__ import annotations

import base64
import datetime
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from .helpers import REPO, SCRIPTS, free_port, launcher_env

WORKER = str(SCRIPTS / "counting_worker.py")
SETTLE = 3.0  # seconds the other agents get to react to a step that must change nothing
WAIT = 120.0  # seconds a step may take on a loaded machine before the test says which state it was stuck in
PEER_TIMEOUT = 4.0  # mbr-launch: a lone signal is told from a job-wide one within half of it


def ft_launcher() -> str | None:
    """NVRx's ft_launcher next to this interpreter (the venv's), or on PATH; None where it is not installed."""
    here = Path(sys.executable).with_name("ft_launcher")
    return str(here) if here.exists() else shutil.which("ft_launcher")


@dataclass(frozen=True)
class Step:
    """One step of a table: ``action`` ("spare": start one more agent, "spare 2": two; "kill N": SIGTERM agent
    N, counted in start order), then the job's (runs, live ranks, live agents); ``quiet``: nothing may move
    after it."""

    action: str
    runs: int
    world: int
    agents: int
    quiet: bool = False
    what: str = ""


class Job:
    """Agents of one job; ``close`` kills whatever is left (each agent runs in its own session)."""

    def __init__(self, tmp: Path, launcher: str, args: Sequence[str], *, nproc: int, nnodes: str = "2:3",
                 endpoint_port: int | None = None, log: Callable[[str], None] = print) -> None:
        self.tmp, self.launcher, self.nproc, self.log = tmp, launcher, nproc, log
        self.port = endpoint_port or free_port()
        self.run_id = f"table{self.port}"
        self.runs_file, self.live_file, self.end_file = tmp / "runs", tmp / "live", tmp / "end"
        self.agents: list[subprocess.Popen] = []
        self._store: Any = None  # a client of the rendezvous store, to read torch's state
        self.began = time.monotonic()
        common = [f"--nproc-per-node={nproc}", f"--nnodes={nnodes}", "--rdzv-backend=c10d",
                  f"--rdzv-endpoint=127.0.0.1:{self.port}", f"--rdzv-id={self.run_id}", *args]
        if launcher == "mbr-launch":
            self.command = [sys.executable, "-m", "mbr_launch", "--skip-check", "all", "--standby", "off",
                            "--status", "off", "--peer-timeout", str(PEER_TIMEOUT), *common]
        else:
            self.command = [launcher, *common]

    # ---- agents --------------------------------------------------------------------------------------

    def start(self, *, host: bool = False) -> int:
        i = len(self.agents)
        out = open(self.tmp / f"agent{i}.log", "w")
        extra = ["--log-dir", str(self.tmp / f"logs{i}")] if self.command[0] == sys.executable else []
        self.agents.append(subprocess.Popen(
            [*self.command, *extra, f"--rdzv-conf=is_host={int(host)}", WORKER, "--runs-file", str(self.runs_file),
             "--live-file", str(self.live_file), "--end-file", str(self.end_file)],
            stdout=out, stderr=subprocess.STDOUT, env=launcher_env(), cwd=REPO, start_new_session=True))
        out.close()
        return i

    def kill(self, i: int) -> int:
        """A plain ``kill`` (SIGTERM) of agent ``i``; its exit code once it is gone."""
        self.agents[i].send_signal(signal.SIGTERM)
        return self.agents[i].wait(WAIT)

    def alive(self) -> int:
        return sum(a.poll() is None for a in self.agents)

    def output(self, i: int) -> str:
        return (self.tmp / f"agent{i}.log").read_text(errors="replace")

    def close(self) -> None:
        for agent in self.agents:
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGKILL)
                agent.wait()

    # ---- what the workers and the rendezvous say ----------------------------------------------------

    def runs(self) -> int:
        return len(self.runs_file.read_text().splitlines()) if self.runs_file.exists() else 0

    def world(self) -> int:
        lines = self.live_file.read_text().splitlines() if self.live_file.exists() else []
        return sum(int(line.split()[0]) for line in lines)

    def counts(self) -> tuple[int, int, int]:
        return self.runs(), self.world(), self.alive()

    def listed(self) -> int | None:
        """Agents torch's rendezvous state lists (in the round, waiting, spares); None while unreadable."""
        from torch.distributed import TCPStore

        try:
            if self._store is None:
                self._store = TCPStore("127.0.0.1", self.port, is_master=False, wait_for_workers=False,
                                       timeout=datetime.timedelta(seconds=10))
            raw = self._store.get(f"torch.rendezvous.{self.run_id}")
            state = pickle.loads(base64.b64decode(raw))  # this test's own job: trusted
        except Exception:  # noqa: BLE001 - not up yet (a new connection next time)
            self._store = None
            return None
        return len(state.participants) + len(state.wait_list) + len(getattr(state, "redundancy_list", ()))

    def wait_until(self, ok: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
        deadline = time.monotonic() + timeout
        while not ok():
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.launcher}: {what} not within {timeout:g} s: runs, world, agents "
                                     f"{self.counts()}, listed {self.listed()}\n" + self.tails())
            time.sleep(0.1)

    def tails(self) -> str:
        return "\n".join(f"--- agent {i}:\n" + self.output(i)[-2500:] for i in range(len(self.agents)))

    # ---- a table ------------------------------------------------------------------------------------------

    def step(self, step: Step) -> None:
        expected = (step.runs, step.world, step.agents)
        if step.action.startswith("spare"):
            for _ in range(int(step.action.split()[1]) if " " in step.action else 1):
                self.start()
            if step.quiet:  # the new agent is in: every live agent is listed
                self.wait_until(lambda: self.listed() == self.alive(), f"agent {len(self.agents) - 1} in the rendezvous")
        elif step.action.startswith("kill "):
            self.kill(int(step.action.split()[1]))
        if step.quiet:
            time.sleep(SETTLE)
            assert self.counts() == expected, (f"{self.launcher}: after {step.action!r} ({step.what}): runs, "
                                               f"world, agents {self.counts()}, expected {expected}\n" + self.tails())
        else:
            self.wait_until(lambda: self.counts() == expected, f"after {step.action!r} ({step.what}): runs, world, "
                            f"agents {expected}")
        self.log(f"{time.monotonic() - self.began:6.1f} s  {step.action:8} {step.what}: {self.counts()}")

    def end(self, timeout: float = WAIT) -> list[int | None]:
        """The workers' time limit: every live rank ends; every agent's exit code."""
        self.end_file.touch()
        deadline = time.monotonic() + timeout
        for agent in self.agents:
            try:
                agent.wait(max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                break
        return [a.poll() for a in self.agents]
