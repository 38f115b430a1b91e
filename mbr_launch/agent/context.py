"""What the supervisor loop and its handlers share: the collaborators, each a ``Protocol`` naming only what
the agent calls (``agent.lifecycle`` wires the real ones; tests replay histories with fakes), and the state
that outlives one event. What one round knows is a ``RoundState``, made fresh as each round starts.
"""

from __future__ import annotations

import contextlib
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Iterable, Iterator, Protocol, Sequence

from mbr_launch.agent.messages import Departure, Event, Progress, RankExpired, RankStarted, RoundResult
from mbr_launch.agent.wakeup import Wakeup
from mbr_launch.cluster.inquiry import Opener
from mbr_launch.cluster.joining import JoinState
from mbr_launch.cluster.round import Round
from mbr_launch.cluster.stops import StopMessage
from mbr_launch.cluster.storeguard import StoreUnreachable, store_errors
from mbr_launch.decide.verdict import RankEvidence, Verdict
from mbr_launch.config.model import LaunchConfig
from mbr_launch.report.events import EventLog
from mbr_launch.report.summary import RunSummary
from mbr_launch.workers.process import Worker

if TYPE_CHECKING:  # annotations only
    from torch.distributed.elastic.rendezvous import RendezvousHandler


class Group(Protocol):
    """This node's workers (``workers.group.WorkerGroup``)."""

    workers: list[Worker]

    def start(self, rnd: Round, local_ranks: list[int] | None = None, *, restart_count: int | None = None) -> None: ...
    def stop(self, rnd: Round | None, *, local_ranks: list[int] | None = None,
             first_signal: int = signal.SIGTERM, grace: float = 30.0) -> None: ...
    def reap(self, rnd: Round) -> list[Worker]: ...
    def last_lines(self, worker: Worker) -> list[str]: ...
    def settle_output(self, *, timeout: float) -> None: ...
    def pidfds(self) -> list[int]: ...
    def all_succeeded(self) -> bool: ...
    def by_local_rank(self, local_rank: int) -> Worker | None: ...
    def training(self) -> None: ...


class Membership(Protocol):
    """The rendezvous and the job-wide counts it keeps (``cluster.rendezvous.Rendezvous``)."""

    def next_round(self, previous: Round | None = None, skip_fast: str | None = None) -> Round: ...
    def counts(self, rnd: Round) -> tuple[int, int]: ...
    def count_restart(self, rnd: Round, *, startup: bool, once_per_round: bool) -> int: ...
    def count_node_failure(self, rnd: Round, node: str) -> int: ...
    def spare_count(self) -> int: ...
    def job_get(self, key: str) -> bytes | None: ...
    def existing_handler(self) -> RendezvousHandler | None: ...
    def leave(self) -> str | None: ...
    def state(self) -> JoinState | None: ...


class Watch(Protocol):
    """The threads that watch one round for this agent (``agent.watch.RoundWatch``)."""

    def store_silence(self) -> float | None: ...
    def watch_all_done(self) -> None: ...
    def watch_inquiry(self, number: int) -> None: ...
    def cancel(self) -> None: ...


class Cluster(Protocol):
    """Cross-node operations of one round (``agent.watch.StoreCluster``)."""

    def watch(self, rnd: Round, post: Callable[[Event], None]) -> Watch: ...
    def publish(self, rnd: Round, message: StopMessage) -> bool: ...
    def read(self, rnd: Round) -> StopMessage | None: ...
    def mark_done(self, rnd: Round) -> bool: ...
    def hosts_store(self, rnd: Round) -> bool: ...
    def count_unhealthy(self, rnd: Round, *, add: bool) -> int: ...
    # a stop signal, and the nodes that leave (cluster.departures)
    def record_signal(self, rnd: Round, signal_name: str) -> int: ...
    def count_signalled(self, rnd: Round) -> int: ...
    def mark_left(self, rnd: Round) -> frozenset[int]: ...
    def left(self, rnd: Round) -> frozenset[int]: ...
    # the hang inquiry (cluster.inquiry)
    def open_inquiry(self, rnd: Round, opener: Opener) -> Opener: ...
    def publish_evidence(self, rnd: Round, number: int, evidence: Sequence[RankEvidence]) -> None: ...
    def collect_evidence(self, rnd: Round, number: int, *, deadline: float) -> tuple[list[RankEvidence], list[int]]: ...
    def publish_verdict(self, rnd: Round, number: int, verdict: Verdict) -> Verdict: ...
    def wait_verdict(self, rnd: Round, number: int, *, deadline: float) -> Verdict | None: ...


class Monitor(Protocol):
    """The rank monitor process as the loop sees it (``agent.lifecycle.MonitorHandle``)."""

    @property
    def pidfd(self) -> int | None: ...
    def reap(self) -> int | None: ...
    def restart(self) -> None: ...
    def last_sections(self, local_ranks: Iterable[int]) -> dict[int, str | None]: ...
    def ages(self, local_ranks: Iterable[int]) -> dict[int, float]: ...
    def pending_signals(self) -> frozenset[int] | None: ...
    def snapshot(self) -> dict[str, Any] | None: ...


class Feature(Protocol):
    """An optional part of the round (``agent.features`` draws where each hook comes); every default does nothing."""

    def monitor_settings(self) -> dict[str, Any]: return {}
    def before_join(self, ctx: Context, previous: Round | None) -> int | None: return None
    def closed(self, ctx: Context) -> tuple[int, str] | None: return None
    def round_begins(self, ctx: Context, rnd: Round) -> None: return None
    def workers_started(self, ctx: Context, rnd: Round, local_ranks: list[int]) -> None: return None
    def observe(self, ctx: Context, event: RankStarted | Progress) -> None: return None
    def tick(self, ctx: Context, rnd: Round) -> RoundResult | None: return None
    def detected(self, ctx: Context) -> None: return None
    def attempt_ended(self, ctx: Context, cause: str, detail: str = "") -> None: return None
    def on_failure(self, ctx: Context, rnd: Round) -> tuple[str, int] | None: return None
    def round_ended(self, ctx: Context, result: RoundResult) -> None: return None
    def job_ends(self, ctx: Context, code: int) -> None: return None
    def close(self) -> None: return None


class Guard(Protocol):
    def around(self, seconds: float, what: str) -> ContextManager[None]: ...


@dataclass(frozen=True)
class Postponed:
    """An expiry that came in the quiet time after a verdict (``agent.inquiry.resume_postponed``)."""

    event: RankExpired
    pid: int | None  # the worker's process when its deadline passed (a restarted rank's old expiry is moot)
    at: float  # when it came, on ``Context.clock``


@dataclass
class InquiryState:
    number: int = 0  # the next inquiry's number in this round
    quiet_until: float = float("-inf")
    expired: dict[int, object] = field(default_factory=dict)  # local rank -> its RankExpired, this round
    timed_out: dict[int, str] = field(default_factory=dict)  # rank -> the line of its collective timeout
    elsewhere: str | None = None  # a verdict named a culprit on another node, which acts on it: its reason
    elsewhere_by: float = float("inf")  # ... and must have stopped the round by then (else: restart the job)
    postponed: dict[int, Postponed] = field(default_factory=dict)  # local rank -> its expiry in a quiet time

    def quiet(self, now: float) -> bool:
        return now < self.quiet_until


@dataclass
class RoundState:
    """What one round of this node knows: made fresh as each round starts, so nothing leaks into the next."""

    started: float = 0.0  # when the round's workers were started, on ``Context.clock``
    watch: Watch | None = None  # the threads watching the round (None before the first round)
    heartbeats: set[int] = field(default_factory=set)  # local ranks past start-up
    lost: set[int] = field(default_factory=set)  # local ranks left lost (--restart-policy min-healthy)
    inquiry: InquiryState = field(default_factory=InquiryState)


@dataclass
class Context:
    cfg: LaunchConfig
    node: str
    log: EventLog
    say: Callable[[str], None]
    group: Group
    rendezvous: Membership
    cluster: Cluster
    monitor: Monitor
    wakeup: Wakeup
    guard: Guard
    clock: Callable[[], float]
    run_dir: Path
    started: float  # when the agent started, on ``clock``
    # this node's ranks' evidence, within the bound (None: ``agent.inquiry.gather`` reads the real ones)
    gather_evidence: Callable[[Round, float], Sequence[RankEvidence]] | None = None
    features: list[Feature] = field(default_factory=list)  # the round's optional features, in the order they act
    round: Round | None = None  # the latest round joined
    summary: RunSummary = field(default_factory=RunSummary)
    quick_failures: int = 0  # consecutive failures of rounds that died young (a crash loop)
    monitor_warnings: int = 0  # refusals and errors the rank monitor reported, this run
    departure: Departure = Departure.CLOSE
    current: RoundState = field(default_factory=RoundState)  # the latest round's state, made fresh by the loop

    @contextlib.contextmanager
    def store_call(self, what: str) -> Iterator[None]:
        """Bound a store call (a cut link never returns: the guard exits 3); a store that is gone raises
        ``StoreUnreachable`` naming ``what``."""
        with self.guard.around(self.cfg.rendezvous.peer_timeout * 2 + 5, what):
            try:
                yield
            except store_errors() as err:
                raise StoreUnreachable(what, err) from err

    def finished_here(self) -> bool:
        """Every local worker has ended: succeeded, or lost to min-healthy with the job going on without it."""
        workers = self.group.workers
        return bool(workers) and all(w.status is not None and (w.status.ok or w.local_rank in self.current.lost)
                                     for w in workers)
