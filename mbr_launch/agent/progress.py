"""Signs of life where a person waits on the launcher: the rendezvous, the crash-loop back-off, a stop's grace.
Nothing while a wait is quick, then a line every few seconds or on a change; a signal cuts each wait short.
"""

from __future__ import annotations

import math
import signal
import threading
import time
from typing import Callable, Collection, Sequence

from mbr_launch.agent.context import Context
from mbr_launch.agent.wakeup import Wakeup
from mbr_launch.cluster.joining import JoinCounter, JoinState
from mbr_launch.workers.process import Worker

# Rendezvous: silent for FIRST_REPORT s, then a line every REPORT_EVERY s (REPORT_EVERY_LATER after LATER_AFTER).
FIRST_REPORT = 2.0
REPORT_EVERY = 5.0
REPORT_EVERY_LATER = 30.0
LATER_AFTER = 60.0
POLL = 1.0  # seconds between two looks at the clock (and, in small jobs, reads of the rendezvous state)
# Each read of torch's rendezvous state is O(nodes) bytes from the store host: spread, whatever the job's size.
STATE_READS_PER_SECOND = 16.0
COUNTDOWN_EVERY = 10.0  # seconds between the back-off's countdown lines
STOP_FIRST_REPORT = 1.0  # a stop's grace: the first line after this, then every STOP_REPORT_EVERY
STOP_REPORT_EVERY = 5.0


class JoinReport:
    """When to say what about a rendezvous under way (pure: times are seconds since the join began)."""

    def __init__(self, *, min_nodes: int, max_nodes: int, timeout: float) -> None:
        self.expected = str(min_nodes) if min_nodes == max_nodes else f"{min_nodes}-{max_nodes}"
        self.timeout = timeout
        self.last_state: JoinState | None = None  # the latest state read (for the timeout's message)
        self._said_at: float | None = None
        self._said_state: JoinState | None = None

    def line(self, elapsed: float, state: JoinState | None) -> str | None:
        if state is not None:
            self.last_state = state
        else:  # not read this time (reads are spread in large jobs): the latest count stands
            state = self.last_state
        if elapsed < FIRST_REPORT:
            return None
        every = REPORT_EVERY if elapsed < LATER_AFTER else REPORT_EVERY_LATER
        changed = state is not None and state != self._said_state
        if self._said_at is not None and not changed and elapsed - self._said_at < every:
            return None
        self._said_at, self._said_state = elapsed, state
        waited = f"waiting {elapsed:.0f} s of {self.timeout:.0f} s"
        if state is None:
            return f"rendezvous: {waited} for {self.expected} nodes"
        if state.complete:  # the latest round formed without this node: admitted once its nodes rejoin
            return f"rendezvous: {state.waiting} node(s) queued until the current round's nodes rejoin, {waited}"
        return f"rendezvous: {state.joined} of {self.expected} nodes joined, {waited}"

    def timed_out(self) -> str:
        state = self.last_state
        seen = f", {state.joined} of {self.expected} nodes joined" if state and not state.complete else ""
        return (f"the rendezvous timed out after {self.timeout:g} s{seen} (raise the limit with "
                f"--rdzv-conf join_timeout=SECONDS, or start the missing nodes)")


class JoinProgress:
    """A thread that reports a rendezvous under way (the join's own thread is blocked inside torch)."""

    def __init__(self, report: JoinReport, counter: JoinCounter | None, say: Callable[[str], None], *,
                 clock: Callable[[], float] = time.monotonic, read_every: float = POLL) -> None:
        self.report = report
        self._counter = counter
        self._read_every = read_every
        self._say = say
        self._clock = clock
        self._began = clock()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rdzv-progress", daemon=True)

    def start(self) -> "JoinProgress":
        self._thread.start()
        return self

    def __enter__(self) -> "JoinProgress":
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stopped.set()  # not joined: a store read may take its 2 s timeout, and nothing waits on it

    def _run(self) -> None:
        next_read = FIRST_REPORT - POLL  # no store connection for a join that completes before a line is due
        while not self._stopped.wait(POLL):
            elapsed = self._clock() - self._began
            state = None
            if self._counter and elapsed >= next_read:
                state = self._counter.read()
                next_read = elapsed + self._read_every
            line = self.report.line(elapsed, state)
            if line and not self._stopped.is_set():
                self._say(line)


def join_progress(ctx: Context) -> JoinProgress:
    rdzv = ctx.cfg.rendezvous
    report = JoinReport(min_nodes=rdzv.min_nodes, max_nodes=rdzv.max_nodes, timeout=rdzv.join_timeout)
    counter = None
    if rdzv.backend == "c10d":
        # The handler is made on the first join, by the blocked thread: asked for at each read.
        counter = JoinCounter(ctx.rendezvous.existing_handler, ctx.rendezvous.sealer)
    read_every = max(POLL, rdzv.max_nodes / STATE_READS_PER_SECOND)
    return JoinProgress(report, counter, ctx.say, read_every=read_every).start()  # real time: what a person waits


def timed_out(error: BaseException) -> bool:
    from torch.distributed.elastic.rendezvous import RendezvousTimeoutError

    return isinstance(error.__cause__, RendezvousTimeoutError)


def bounded_backoff(ctx: Context, seconds: float) -> float:
    """A back-off between 0 and --restart-backoff-max: a peer's number may be NaN or inf."""
    if math.isnan(seconds):
        return 0.0
    return min(max(seconds, 0.0), ctx.cfg.policy.backoff_max)


def back_off(ctx: Context, seconds: float, origin: str | None = None) -> bool:
    """The crash-loop back-off (``origin``'s, when not this node's), counted down; False when a signal cut it."""
    seconds = bounded_backoff(ctx, seconds)
    if seconds > 0:
        count = ctx.quick_failures
        why = (f"back-off after {count} quick failure{'s' if count != 1 else ''}" if origin is None and count
               else f"crash-loop back-off{f' of {origin}' if origin else ''}")
        ctx.say(f"restarting in {seconds:g} s ({why}; Ctrl-C stops)")
    end = ctx.clock() + seconds
    while True:
        left = end - ctx.clock()
        step = left - COUNTDOWN_EVERY * math.floor((left - 1e-9) / COUNTDOWN_EVERY) if left > COUNTDOWN_EVERY else left
        if not ctx.wakeup.sleep(max(0.0, step)):
            return False
        left = end - ctx.clock()
        if left <= 0.05:
            return True
        ctx.say(f"restarting in {left:.0f} s")


class StopProgress:
    """One stop's grace, watched: who is still running, when SIGKILL comes. A stop request ends the grace at
    once; a preemption signal does not (the grace lets the workers finish a checkpoint)."""

    def __init__(self, wakeup: Wakeup, say: Callable[[str], None], grace: float, *,
                 preemption: Collection[str] = (), clock: Callable[[], float] = time.monotonic) -> None:
        self._wakeup, self._say, self._grace, self._clock = wakeup, say, grace, clock
        self._preemption = frozenset(preemption)
        self._began = clock()
        self._said_at: float | None = None

    def __call__(self, stopping: Sequence[Worker], alive: Sequence[Worker], left: float) -> bool:
        names = [signal.Signals(signum).name for signum in self._wakeup.pending_signals()]
        cutting = next((name for name in names if name not in self._preemption), None)
        if cutting is not None:
            self._say(f"received {cutting} while stopping: killing {_ranks(alive)} now")
            return True
        elapsed = self._clock() - self._began
        if elapsed < STOP_FIRST_REPORT or (self._said_at is not None and elapsed - self._said_at < STOP_REPORT_EVERY):
            return False
        if self._said_at is None:
            self._say(f"stopping {_ranks(alive)}: waiting up to {self._grace:g} s for "
                      f"{'them' if len(alive) > 1 else 'it'} to exit (Ctrl-C kills at once)")
        else:
            self._say(f"stopping: {_ranks(alive)} still running, SIGKILL in {left:.0f} s")
        self._said_at = elapsed
        return False


def _ranks(workers: Sequence[Worker]) -> str:
    ranks = sorted(w.rank for w in workers)
    shown = ",".join(str(r) for r in ranks[:8]) + (",..." if len(ranks) > 8 else "")
    return f"rank{'s' if len(ranks) != 1 else ''} {shown}"


def farewell(wakeup: Wakeup, thread: threading.Thread, bound: float) -> None:
    """Wait up to ``bound`` s for the rendezvous farewell ``thread``; a signal ends the wait at once."""
    deadline = time.monotonic() + bound
    while thread.is_alive() and wakeup.pending_signal() is None and (left := deadline - time.monotonic()) > 0:
        thread.join(min(left, 0.1))

