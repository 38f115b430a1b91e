"""Noticing peers that vanish, within a bounded window, instead of waiting for NCCL (pytorch#111646).

Each agent beats into the round's control keys; the lowest group rank still in the round watches every peer,
the others watch it (O(N) traffic). Silence is judged by ``decide.liveness``. A store call on a dropped
connection never returns, so this thread only records when the store last answered and the agent's loop asks
``store_silence``. The same thread asks whether nodes wait to join, keeping store calls off the main loop.

What this machine tells of liveness: process identities, and own time, ticked by one daemon thread per
process and read by every watcher, so a process starved of CPU counts less silence everywhere at once.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Union

from mbr_launch import procstat
from mbr_launch.cluster.departures import LEFT_KEY, decode_left
from mbr_launch.cluster.jobstore import STORE_HOST_KEY, JobStore, beat_key
from mbr_launch.cluster.listen import holds, listening_inodes
from mbr_launch.cluster.rendezvous import release_control
from mbr_launch.cluster.round import Round
from mbr_launch.cluster.torch_internals import matches_this_machine
from mbr_launch.decide import liveness
from mbr_launch.decide.liveness import Beat, Identity, OwnTime, Seen, SlowestAnswer, grace

# ---- this machine's view: identities and own time -------------------------------------------------------

TICK = 0.25  # seconds between own-time ticks: small against any timeout, and 4 cheap wake-ups a second


@lru_cache(maxsize=1)
def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read(64).strip()
    except OSError:
        return ""


def _namespace(name: str) -> int:
    try:
        return os.stat(f"/proc/self/ns/{name}").st_ino
    except OSError:
        return 0


def my_identity() -> Identity | None:
    return _identity(os.getpid())


@lru_cache(maxsize=1)
def _identity(pid: int) -> Identity | None:  # by pid: a forked child is another process
    return _identity_of(pid)


def seen(identity: Identity | None, me: Identity | None) -> Seen:
    """ALIVE when ``identity`` is a running or sleeping process on this machine; else SILENT."""
    if identity is None or me is None or not me.same_machine(identity):
        return Seen.SILENT
    stat = procstat.read(identity.pid)
    if stat is None or stat.start_time != identity.start_time or stat.zombie or stat.state in ("T", "t"):
        return Seen.SILENT
    return Seen.ALIVE


def listener(host: str, port: int) -> Identity | None:
    """The local process listening on ``host``:``port`` (the store's agent, known before the store answers);
    None when not here. Reads every process's descriptors: call only after a silence."""
    inodes = listening_inodes(port) if port > 0 else set()
    if not inodes or not matches_this_machine(host):
        return None
    return next((_identity_of(int(name)) for name in os.listdir("/proc") if name.isdigit() and holds(name, inodes)),
                None)


def _identity_of(pid: int) -> Identity | None:
    stat = procstat.read(pid)
    boot = _boot_id()
    if stat is None or not boot:
        return None
    return Identity(boot, _namespace("pid"), _namespace("net"), pid, stat.start_time)


class OwnClock:
    def __init__(self, period: float = TICK) -> None:
        self._own = OwnTime(time.monotonic(), period)
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="own-time", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            time.sleep(self._own.period)
            self.now()

    def now(self) -> float:
        with self._lock:
            return self._own.tick(time.monotonic())


_CLOCK: OwnClock | None = None
_START = threading.Lock()


def own_time() -> float:
    """This process's own time (``decide.liveness.OwnTime``); starts the ticking thread at first use."""
    global _CLOCK
    if _CLOCK is None:
        with _START:
            if _CLOCK is None:
                _CLOCK = OwnClock()
    return _CLOCK.now()


# ---- the watch -------------------------------------------------------------------------------------------

# The store's host for the job (the same agent in every round), kept across rounds. None: looked for on this
# machine and not found (not looked for again; the store's own key still names it).
_STORE_HOSTS: dict[tuple[str, int], Identity | None] = {}


def store_host(rnd: Round) -> Identity | None:
    """The agent serving ``rnd``'s store when known (from an earlier round's key, or found listening here)."""
    key = (rnd.store_host, rnd.store_port)
    if key not in _STORE_HOSTS:
        _STORE_HOSTS[key] = listener(*key)
    return _STORE_HOSTS[key]


def store_host_alive(rnd: Round) -> bool:
    """Whether the agent serving ``rnd``'s store runs on this machine (then a slow call is starved, not cut off)."""
    return seen(store_host(rnd), my_identity()) is Seen.ALIVE


@dataclass(frozen=True)
class PeerLost:
    group_rank: int
    silent_for: float

    def describe(self) -> str:
        return f"the agent of group rank {self.group_rank} has been silent for {self.silent_for} s (dead or cut off)"


@dataclass(frozen=True)
class PeersLeft:
    """Nodes left the round (a signal that did not reach the whole job); it goes on without them."""

    group_ranks: tuple[int, ...]


@dataclass(frozen=True)
class StoreLost:
    detail: str

    def describe(self) -> str:
        return self.detail


Silence = Union[PeerLost, StoreLost]


class PeerWatch:
    def __init__(self, rnd: Round, *, timeout: float, on_lost: Callable[[Silence], None],
                 waiting: Callable[[], int] | None = None, on_waiting: Callable[[int], None] | None = None,
                 on_left: Callable[[PeersLeft], None] | None = None, hosting: bool = False,
                 clock: Callable[[], float] = time.monotonic, own: Callable[[], float] = own_time,
                 seen: Callable[[Identity | None, Identity | None], Seen] = seen,
                 me: Identity | None = None) -> None:
        self._round = rnd
        self._timeout = timeout
        self._interval = max(0.05, timeout / 4)
        self._on_lost = on_lost
        self._waiting = waiting  # asked by the watching node only (``_chief``)
        self._on_waiting = on_waiting
        self._on_left = on_left
        self._left: frozenset[int] = frozenset()  # group ranks that left the round
        self._hosting = hosting  # this agent serves the store: it names itself under STORE_HOST_KEY
        self._clock, self._own, self._seen = clock, own, seen
        self._me = me if me is not None else my_identity()
        self._slowest = SlowestAnswer(half_life=timeout)
        self._answered = own()  # own time at which the store last answered this thread (or its host was seen alive)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"peer-watch-{rnd.index}", daemon=True)

    def start(self) -> None:
        if self._round.group_world_size > 1 or (self._waiting is not None and self._round.group_rank == 0):
            self._thread.start()

    @property
    def _store_host(self) -> Identity | None:
        return _STORE_HOSTS.get((self._round.store_host, self._round.store_port))

    def _store_silence(self) -> float | None:
        now = self._own()
        silent = now - self._answered
        if silent < self._timeout:
            return None  # the common case: no /proc read
        if self._seen(store_host(self._round), self._me) is Seen.ALIVE:
            self._answered = now  # its host runs here: slow, not cut off
            return None
        return silent if silent >= grace(self._timeout, self._slowest.at(self._clock())) else None

    def store_silence(self) -> float | None:
        """For the agent's loop: the store's silence once it is a verdict (None also when nothing is watched)."""
        return self._store_silence() if self._thread.is_alive() else None

    def cancel(self) -> None:
        self._stop.set()

    def join(self, timeout: float) -> None:
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _chief(self) -> int:
        """The node that watches every other: the lowest group rank still in the round."""
        return min((r for r in range(self._round.group_world_size) if r not in self._left),
                   default=self._round.group_rank)

    def watched(self) -> list[int]:
        me, size, chief = self._round.group_rank, self._round.group_world_size, self._chief()
        return [r for r in range(size) if r != me and r not in self._left] if me == chief else [chief]

    def _lost_store(self, what: str, err: BaseException) -> None:
        silent = self._own() - self._answered
        self._on_lost(StoreLost(f"{what} the rendezvous store at {self._round.store_host}:{self._round.store_port} "
                                f"for {silent:.1f} s: {type(err).__name__}: {err}"))

    def _connect(self) -> Any:
        """A control connection, retried until the store has been unreachable for its grace (a host slow to
        accept is not a lost store)."""
        while not self._stop.is_set():
            try:
                store = self._round.connect_control(timeout=max(1.0, self._timeout))
                self._answered = self._own()
                return store
            except Exception as err:
                if self._store_silence() is not None:
                    self._lost_store("cannot reach", err)
                    return None
                self._stop.wait(self._interval)
        return None

    def _run(self) -> None:
        store = self._connect()
        if store is None:
            return
        if self._watch(store):
            release_control(store)  # stopped with the round, its last operation answered: the next round's

    def _call(self, fn: Callable[[], Any]) -> Any:
        began = self._clock()
        result = fn()
        now = self._clock()
        self._slowest.seen(now - began, now)
        self._answered = self._own()
        return result

    def _start(self, store: Any, keys: list[str]) -> bool:
        """Name this agent (and the store's host) and create every key read later, so multi_get never blocks on
        a late peer. False when the store did not answer."""
        try:
            self._call(lambda: store.set(beat_key(self._round.group_rank), Beat(0, self._me).encode()))
            if self._hosting and self._me is not None:
                self._call(lambda: store.set(STORE_HOST_KEY, self._me.encode()))  # type: ignore[union-attr]
            for key in keys:
                self._call(lambda: store.compare_set(key, "", ""))  # a missing key becomes empty, a set one stays
            return True
        except Exception:
            return False

    def _watch(self, store: Any) -> bool:
        """Watch until stopped (True) or a peer or the store is lost (False)."""
        peers = [beat_key(r) for r in self.watched()]
        host_key = [] if self._store_host else [STORE_HOST_KEY]
        answered = self._start(store, peers + host_key + [LEFT_KEY])
        last: dict[str, bytes] = {}
        silence = {key: liveness.Silence(self._own()) for key in peers}
        identities: dict[str, Identity | None] = {}
        own, count = beat_key(self._round.group_rank), 0
        while not self._stop.wait(self._interval):
            count += 1
            try:
                self._call(lambda: store.set(own, Beat(count, self._me).encode()))
                values = self._call(lambda: store.multi_get(peers + host_key + [LEFT_KEY]))
                answered = True
                self._ask_waiting()
            except Exception as err:
                answered = False
                if self._store_silence() is not None:
                    self._lost_store("no answer from", err)
                    return False
                continue
            if host_key and values[len(peers)]:
                found = Identity.decode(values[len(peers)][:Identity.MAX_TEXT + 1].decode("ascii", errors="replace"))
                if found is not None:
                    _STORE_HOSTS[(self._round.store_host, self._round.store_port)] = found
                    host_key = []
            if self._departures(values[-1]):
                peers = [beat_key(r) for r in self.watched()]
                if not self._start(store, [k for k in peers if k not in silence]):
                    answered = False
                silence = {key: silence.get(key) or liveness.Silence(self._own()) for key in peers}
                continue  # the new peers' beats are read on the next turn
            if self._judge(zip(peers, values), last, silence, identities):
                return False
        return answered

    def _ask_waiting(self) -> None:
        if self._waiting is None or self._on_waiting is None or self._chief() != self._round.group_rank:
            return
        waiting = self._call(self._waiting)
        if waiting > 0:
            self._on_waiting(waiting)

    def _departures(self, raw: bytes) -> bool:
        left = decode_left(raw, keys=JobStore.of_round(self._round), nodes=self._round.group_world_size)
        new = left - self._left - {self._round.group_rank}
        if not new:
            return False
        self._left |= new
        if self._on_left is not None:
            self._on_left(PeersLeft(tuple(sorted(new))))
        return True

    def _judge(self, beats: Any, last: dict[str, bytes], silence: dict[str, liveness.Silence],
               identities: dict[str, Identity | None]) -> bool:
        """Look at each watched beat; True when one's silence is a verdict (reported)."""
        now = self._own()
        limit = grace(self._timeout, self._slowest.at(self._clock()))
        host = self._store_host
        for key, value in beats:
            moved = last.get(key) != value
            if moved:
                last[key] = value
                identities[key] = Beat.decode(value).identity
            who = identities.get(key)
            # the store just answered: the agent serving it is alive (no /proc read for a beat that moved)
            seen = Seen.ALIVE if host is not None and who == host else \
                Seen.SILENT if moved else self._seen(who, self._me)
            silent = silence[key].observe(now, sign=moved, seen=seen)
            if silent >= limit:
                self._on_lost(PeerLost(group_rank=int(key.split("/")[1]), silent_for=round(silent, 2)))
                return True
        return False
