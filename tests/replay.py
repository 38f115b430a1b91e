"""Fakes that let a test replay a scripted history through the real supervisor loop (``agent.loop``) without
spawning a process: the workers, the rendezvous, the round's store, the rank monitor and the clock are fakes;
the loop, the handlers, the failure path, the pure policy and the event log are the real ones.

A script is a list of steps; the loop's every wait takes the next step (and advances the fake clock by the
wait's timeout). A step is a callable ``step(world)``: make a worker exit, post an event, deliver a signal.
When the script runs out while the loop still waits, the test fails instead of spinning.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

from mbr_launch import api
from mbr_launch.agent.context import Context
from mbr_launch.agent.loop import Supervisor
from mbr_launch.agent.messages import Event
from mbr_launch.agent.wakeup import Wakeup
from mbr_launch.cluster.inquiry import Opener
from mbr_launch.cluster.joining import JoinState
from mbr_launch.cluster.rendezvous import RendezvousFailed
from mbr_launch.cluster.round import Round
from mbr_launch.cluster.storevalue import Sealer
from mbr_launch.cluster.stops import StopMessage
from mbr_launch.decide.verdict import ProcState, RankEvidence, StackClass, Verdict
from mbr_launch.report.events import EventLog
from mbr_launch.report.exitstatus import ExitStatus


class ScriptExhausted(AssertionError):
    pass


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class FakeSpec:
    env: dict[str, str]


@dataclass
class FakeWorker:
    rank: int
    local_rank: int
    pid: int
    spec: FakeSpec
    started: float
    status: ExitStatus | None = None
    noticed: bool = False

    @property
    def alive(self) -> bool:
        return self.status is None


def exited(code: int) -> ExitStatus:
    return ExitStatus.from_returncode(code)


def killed(sig: int) -> ExitStatus:
    return ExitStatus.from_returncode(-sig)


class FakeGroup:
    def __init__(self, nproc: int, clock: FakeClock) -> None:
        self.nproc, self.clock = nproc, clock
        self.workers: list[FakeWorker] = []
        self.starts: list[tuple[int, list[int] | None]] = []  # (round index, local ranks or None: all)
        self.stops: list[dict[str, Any]] = []  # each stop() call's arguments, while some rank was alive
        self.lines: dict[int, list[str]] = {}  # local rank -> its last stderr lines, as the test scripts them
        self.trained = False  # every local rank was reported past start-up (standbys may then be promoted)
        self._pid = 5000
        self.before_stop: Any = None  # as WorkerGroup's: told which workers a stop is about to signal

    def training(self) -> None:
        self.trained = True

    def start(self, rnd: Round, local_ranks: list[int] | None = None, *, restart_count: int | None = None) -> None:
        self.starts.append((rnd.index, local_ranks))
        for lr in range(self.nproc) if local_ranks is None else local_ranks:
            self._pid += 1
            worker = FakeWorker(rank=rnd.rank_offset + lr, local_rank=lr, pid=self._pid, started=self.clock(),
                                spec=FakeSpec({"TORCHELASTIC_ERROR_FILE": os.devnull}))
            self.workers = sorted([w for w in self.workers if w.local_rank != lr] + [worker], key=lambda w: w.local_rank)

    def stop(self, rnd: Round | None, *, local_ranks: list[int] | None = None, first_signal: int = signal.SIGTERM,
             grace: float = 30.0) -> None:
        targets = [w for w in self.workers if (local_ranks is None or w.local_rank in local_ranks) and w.alive]
        if targets and self.before_stop:
            self.before_stop(targets)
        if targets:
            self.stops.append({"local_ranks": local_ranks, "signal": signal.Signals(first_signal).name, "grace": grace})
        for worker in targets:
            worker.status, worker.noticed = killed(first_signal), True

    def reap(self, rnd: Round) -> list[FakeWorker]:
        ended = [w for w in self.workers if w.status is not None and not w.noticed]
        for worker in ended:
            worker.noticed = True
        return ended

    def pidfds(self) -> list[int]:
        return []

    def last_lines(self, worker: FakeWorker) -> list[str]:
        return self.lines.get(worker.local_rank, [])

    def settle_output(self, *, timeout: float) -> None:
        pass  # fake workers write no output

    def all_succeeded(self) -> bool:
        return bool(self.workers) and all(w.status is not None and w.status.ok for w in self.workers)

    def by_local_rank(self, local_rank: int) -> FakeWorker | None:
        return next((w for w in self.workers if w.local_rank == local_rank), None)


def make_round(index: int, *, group_rank: int = 0, nodes: int = 1, nproc: int = 2, restart_count: int = 0) -> Round:
    return Round(index=index, group_rank=group_rank, group_world_size=nodes, world_size=nodes * nproc,
                 rank_offset=group_rank * nproc, master_addr="127.0.0.1", master_port=20000 + index,
                 restart_count=restart_count, token=f"t{index}", store=None, control=None,  # type: ignore[arg-type]
                 control_prefix=f"p{index}", store_host="127.0.0.1", store_port=29999)


class FakeRendezvous:
    """Rounds on demand; the job-wide counts a real store would keep."""

    def __init__(self, *, nodes: int = 1, nproc: int = 2, fail_after: int | None = None, spares: int = 0) -> None:
        self.nodes, self.nproc, self.fail_after, self.spares = nodes, nproc, fail_after, spares
        self.joined = 0
        self.asked: list[tuple[int | None, str | None]] = []  # (previous round, why no fast path) per join
        self.restarts = self.startup_restarts = 0
        self.node_failures: dict[str, int] = {}
        self.left = False  # this node left torch's rendezvous (``leave``)
        self.join_state: JoinState | None = None  # what ``state()`` reads (a spare: complete)
        self.job_keys: dict[str, bytes] = {}  # the job's keys another node wrote (``job_get``)
        self.sealer = Sealer()  # the job's (no secret)

    def next_round(self, previous: Round | None = None, skip_fast: str | None = None) -> Round:
        self.asked.append((previous.index if previous else None, skip_fast))
        if self.fail_after is not None and self.joined >= self.fail_after:
            raise RendezvousFailed("rendezvous failed: scripted")
        self.joined += 1
        return make_round(self.joined - 1, nodes=self.nodes, nproc=self.nproc,
                          restart_count=self.restarts + self.startup_restarts)

    def counts(self, rnd: Round) -> tuple[int, int]:
        return self.restarts, self.startup_restarts

    def count_restart(self, rnd: Round, *, startup: bool, once_per_round: bool) -> int:
        if startup:
            self.startup_restarts += 1
        else:
            self.restarts += 1
        return self.restarts + self.startup_restarts

    def count_node_failure(self, rnd: Round, node: str) -> int:
        self.node_failures[node] = self.node_failures.get(node, 0) + 1
        return self.node_failures[node]

    def spare_count(self) -> int:
        return self.spares

    def existing_handler(self) -> None:
        return None  # no torch handler: the join's progress line reads the count as unknown

    def leave(self) -> str | None:
        self.left = True
        return None

    def state(self) -> JoinState | None:
        return self.join_state

    def job_get(self, key: str) -> bytes | None:
        return self.job_keys.get(key)


class FakeWatch:
    def __init__(self) -> None:
        self.silent: float | None = None  # the store's silence once a verdict (PeerWatch.store_silence)
        self.all_done_watched = False
        self.cancelled = False
        self.inquiries: list[int] = []  # the inquiry numbers watched for

    def store_silence(self) -> float | None:
        return self.silent

    def watch_all_done(self) -> None:
        self.all_done_watched = True

    def watch_inquiry(self, number: int) -> None:
        self.inquiries.append(number)

    def cancel(self) -> None:
        self.cancelled = True


class FakeCluster:
    def __init__(self, *, hosts_store: bool = False, all_done: bool = True) -> None:
        self.published: list[StopMessage] = []
        self._first: dict[int, StopMessage] = {}
        self.hosting, self.all_done = hosts_store, all_done
        self.watches: list[FakeWatch] = []
        self.openers: dict[tuple[int, int], Opener] = {}
        self.evidence: dict[tuple[int, int], list[RankEvidence]] = {}
        self.verdicts: dict[tuple[int, int], Verdict] = {}
        self.remote_evidence: list[RankEvidence] = []  # the other nodes' evidence
        self.silent_nodes: list[int] = []  # nodes that send no evidence
        self.remote_verdict: Verdict | None = None  # the verdict another node decided
        self.remote_opener: int | None = None  # the group rank of a node that opens every inquiry first
        self.unhealthy: dict[int, int] = {}  # round index -> nodes that lost a rank (min-healthy), this one included
        self.signalled: dict[int, int] = {}  # round index -> nodes a stop signal reached (set: the others')
        self.departed: dict[int, frozenset[int]] = {}  # round index -> group ranks that left (set: the others')

    def watch(self, rnd: Round, post: Callable[[Event], None]) -> FakeWatch:
        self.watches.append(FakeWatch())
        return self.watches[-1]

    def publish(self, rnd: Round, message: StopMessage) -> bool:
        self.published.append(message)
        return self._first.setdefault(rnd.index, message) is message

    def read(self, rnd: Round) -> StopMessage | None:
        return self._first.get(rnd.index)

    def mark_done(self, rnd: Round) -> bool:
        return self.all_done

    def hosts_store(self, rnd: Round) -> bool:
        return self.hosting

    def count_unhealthy(self, rnd: Round, *, add: bool) -> int:
        """Other nodes' losses are scripted by setting ``unhealthy[round]`` (see ``node_lost``)."""
        self.unhealthy[rnd.index] = self.unhealthy.get(rnd.index, 0) + int(add)
        return self.unhealthy[rnd.index]

    # A stop signal: the other nodes' part is set by the test (signalled, departed).
    def record_signal(self, rnd: Round, signal_name: str) -> int:
        self.signalled[rnd.index] = self.signalled.get(rnd.index, 0) + 1
        return self.signalled[rnd.index]

    def count_signalled(self, rnd: Round) -> int:
        return self.signalled.get(rnd.index, 0)

    def mark_left(self, rnd: Round) -> frozenset[int]:
        self.departed[rnd.index] = self.departed.get(rnd.index, frozenset()) | {rnd.group_rank}
        return self.departed[rnd.index]

    def left(self, rnd: Round) -> frozenset[int]:
        return self.departed.get(rnd.index, frozenset())

    # The hang inquiry: the other nodes' part is set by the test (remote_*, silent_nodes).
    def open_inquiry(self, rnd: Round, opener: Opener) -> Opener:
        first = opener if self.remote_opener is None else Opener(opener.number, self.remote_opener, None, "heartbeat")
        return self.openers.setdefault((rnd.index, opener.number), first)

    def publish_evidence(self, rnd: Round, number: int, evidence: Sequence[RankEvidence]) -> None:
        self.evidence[(rnd.index, number)] = list(evidence)

    def collect_evidence(self, rnd: Round, number: int, *, deadline: float) -> tuple[list[RankEvidence], list[int]]:
        return [*self.evidence.get((rnd.index, number), []), *self.remote_evidence], list(self.silent_nodes)

    def publish_verdict(self, rnd: Round, number: int, verdict: Verdict) -> Verdict:
        return self.verdicts.setdefault((rnd.index, number), verdict)

    def wait_verdict(self, rnd: Round, number: int, *, deadline: float) -> Verdict | None:
        verdict = self.verdicts.get((rnd.index, number), self.remote_verdict)
        if verdict is None or verdict.evidence:
            return verdict
        # as a real decider's (verdict_codec.verdict_to_wire): with the culprits' evidence as published
        published = [e for e in self.evidence.get((rnd.index, number), []) if e.rank in verdict.culprits]
        return dataclasses.replace(verdict, evidence=tuple(published))


class FakeMonitor:
    pidfd = None

    def __init__(self) -> None:
        self.restarts = 0
        self.beats: dict[int, float] = {}  # local rank -> seconds since its last heartbeat or step (unset: unknown)
        self.pending: frozenset[int] | None = None  # signals sent to the monitor's process too (None: no monitor)

    def reap(self) -> int | None:
        return None

    def restart(self) -> None:
        self.restarts += 1

    def last_sections(self, local_ranks: Iterable[int]) -> dict[int, str | None]:
        return dict.fromkeys(local_ranks)

    def ages(self, local_ranks: Iterable[int]) -> dict[int, float]:
        return {r: self.beats[r] for r in local_ranks if r in self.beats}

    def pending_signals(self) -> frozenset[int] | None:
        return self.pending


class NoGuard:
    def __init__(self) -> None:
        self.calls: list[str] = []

    @contextlib.contextmanager
    def around(self, seconds: float, what: str) -> Iterator[None]:
        self.calls.append(what)
        yield


Step = Callable[["World"], None]


class ScriptedWakeup(Wakeup):
    """The real queues; waits and sleeps take scripted steps and fake time instead of blocking."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock)
        self.steps: list[Step] = []
        self.world: World | None = None
        self.sleeps: list[float] = []
        self.waits = 0

    def wait(self, fds: Sequence[int], timeout: float | None) -> list[int]:
        self.waits += 1
        if self.waits > 1000:
            raise ScriptExhausted("the loop waited 1000 times: it does not end")
        assert isinstance(self.clock, FakeClock) and self.world is not None
        self.clock.now += timeout or 0.0
        if self.steps:
            self.steps.pop(0)(self.world)
        elif not self.world.idle_ok:
            raise ScriptExhausted("the script ran out while the loop still waits")
        return []

    def sleep(self, seconds: float) -> bool:
        self.sleeps.append(seconds)
        assert isinstance(self.clock, FakeClock)
        self.clock.now += seconds
        return self.pending_signal() is None


@dataclass
class World:
    ctx: Context
    group: FakeGroup
    rendezvous: FakeRendezvous
    cluster: FakeCluster
    monitor: FakeMonitor
    wakeup: ScriptedWakeup
    clock: FakeClock
    said: list[str] = field(default_factory=list)
    gathers: list[tuple[int, float]] = field(default_factory=list)  # (round index, bound) of each gathering
    # local rank -> how its evidence looks (RankEvidence fields); unset ranks wait in an all_reduce
    looks: dict[int, dict[str, Any]] = field(default_factory=dict)
    idle_ok: bool = False  # waits past the script's end just pass time (for timers: silence, telemetry)

    def run(self, steps: Sequence[Step]) -> int:
        self.wakeup.steps = list(steps)
        return Supervisor(self.ctx).run()

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        records = self.ctx.log.records
        return [r for r in records if name is None or r["event"] == name]


def build_world(tmp_path: Path, *cli_args: tuple[str, Any], nodes: int = 1, nproc: int = 2,
                hosts_store: bool = False, all_done: bool = True, spares: int = 0,
                fail_after: int | None = None) -> World:
    cli: dict[str, Any] = {"nproc_per_node": str(nproc), "rank_monitor": "off", "standby": "off",
                           "log_dir": str(tmp_path), **dict(cli_args)}
    script = tmp_path / "train.py"
    script.write_text("")  # never run: the workers are fakes
    cfg = api.build_launch_config(cli=cli, script=str(script), environ={"PATH": os.environ.get("PATH", "")})
    clock = FakeClock()
    wakeup = ScriptedWakeup(clock)
    group, rendezvous = FakeGroup(nproc, clock), FakeRendezvous(nodes=nodes, nproc=nproc, fail_after=fail_after,
                                                                spares=spares)
    cluster, monitor = FakeCluster(hosts_store=hosts_store, all_done=all_done), FakeMonitor()
    said: list[str] = []
    gathers: list[tuple[int, float]] = []
    looks: dict[int, dict[str, Any]] = {}

    def gather(rnd: Round, bound: float) -> list[RankEvidence]:
        gathers.append((rnd.index, bound))
        waiting = {"state": ProcState.SLEEPING, "stack": StackClass.COLLECTIVE, "collective": "all_reduce",
                   "where": "wait at distributed_c10d.py:3252"}
        return [RankEvidence(rank=w.rank, node="n0", group_rank=rnd.group_rank, local_rank=w.local_rank, pid=w.pid,
                             stacks_path=f"/stacks/{w.rank}", **{**waiting, **looks.get(w.local_rank, {})})
                for w in group.workers if w.alive]

    ctx = Context(cfg=cfg, node="n0", log=EventLog(tmp_path / "events.jsonl", node="n0"), say=said.append,
                  group=group, rendezvous=rendezvous, cluster=cluster, monitor=monitor, wakeup=wakeup,
                  guard=NoGuard(), clock=clock, gather_evidence=gather, run_dir=tmp_path, started=clock())
    world = World(ctx=ctx, group=group, rendezvous=rendezvous, cluster=cluster, monitor=monitor, wakeup=wakeup,
                  clock=clock, said=said, gathers=gathers, looks=looks)
    wakeup.world = world
    return world


# ---- steps ---------------------------------------------------------------------------------------------


def exit_rank(local_rank: int, code: int = 0) -> Step:
    def step(world: World) -> None:
        worker = world.group.by_local_rank(local_rank)
        assert worker is not None and worker.alive, f"local rank {local_rank} is not running"
        worker.status = exited(code)
    return step


def kill_rank(local_rank: int, sig: int = signal.SIGKILL) -> Step:
    def step(world: World) -> None:
        worker = world.group.by_local_rank(local_rank)
        assert worker is not None and worker.alive, f"local rank {local_rank} is not running"
        worker.status = killed(sig)
    return step


def all_exit(code: int = 0) -> Step:
    def step(world: World) -> None:
        for worker in world.group.workers:
            if worker.alive:
                worker.status = exited(code)
    return step


def post(event: Event) -> Step:
    return lambda world: world.wakeup.post(event)


def deliver(signum: int) -> Step:
    return lambda world: world.wakeup.post_signal(signum)


def idle(world: World) -> None:
    """A wait in which nothing happens."""


def silence(seconds: float) -> Step:
    def step(world: World) -> None:
        world.ctx.current.watch.silent = seconds  # type: ignore[union-attr]
    return step


def node_lost(round_index: int = 0) -> Step:
    """Another node of the round lost a rank (min-healthy): the round's count of unhealthy nodes grows."""
    def step(world: World) -> None:
        world.cluster.unhealthy[round_index] = world.cluster.unhealthy.get(round_index, 0) + 1
    return step
