"""The agent's side of one round's cross-node traffic: the watcher threads, turned into typed events, and
the store operations the loop calls (each bounded by the caller through ``Context.store_call``)."""

from __future__ import annotations

from typing import Callable, Sequence

from mbr_launch.agent.messages import AllDone, Event, InquiryOpened, NodesWaiting, PeerStopped
from mbr_launch.cluster import departures, inquiry, stops
from mbr_launch.cluster.inquiry import Opener
from mbr_launch.cluster.jobstore import inquiry_key
from mbr_launch.cluster.peers import PeerWatch
from mbr_launch.cluster.listen import listens_here
from mbr_launch.cluster.rendezvous import Rendezvous
from mbr_launch.cluster.round import Round
from mbr_launch.cluster.stops import StopListener, StopMessage
from mbr_launch.decide.verdict import RankEvidence, Verdict
from mbr_launch.decide.verdict_codec import (evidence_list_from_dicts, evidence_to_dict, verdict_from_dict,
                                             verdict_to_wire)


class RoundWatch:
    """A peer's stop message, a silent peer or store, nodes waiting to join, and (once this node is done)
    every node done: each becomes one event on the agent's queue."""

    def __init__(self, rnd: Round, post: Callable[[Event], None], *, peer_timeout: float,
                 waiting: Callable[[], int] | None, hosting: bool) -> None:
        self._round, self._post = rnd, post
        peers = PeerWatch(rnd, timeout=peer_timeout, on_lost=post, waiting=waiting,
                          on_waiting=lambda count: post(NodesWaiting(count)), on_left=post, hosting=hosting)
        self.store_silence: Callable[[], float | None] = peers.store_silence  # the loop asks the peer watch
        self.threads: list[StopListener | PeerWatch] = [peers]
        self._listen(stops.STOP_KEY, lambda raw: PeerStopped(StopMessage.decode(raw)))
        peers.start()

    def watch_all_done(self) -> None:
        self._listen(stops.ALL_DONE_KEY, lambda _raw: AllDone())

    def watch_inquiry(self, number: int) -> None:
        self._listen(inquiry_key(number, "open"), lambda raw: InquiryOpened(Opener.decode(number, raw)))

    def _listen(self, key: str, event: Callable[[bytes], Event]) -> None:
        watcher = StopListener(self._round, lambda raw: self._post(event(raw)), key=key)
        self.threads.append(watcher)
        watcher.start()

    def cancel(self) -> None:
        for thread in self.threads:
            thread.cancel()

    def join(self) -> None:
        for thread in self.threads:
            thread.join(StopListener.POLL + 1.0)


class StoreCluster:
    """``Cluster`` over the round's store: the store's own operations as they are, the methods below adding
    what a call needs beyond the round (codec, job store)."""

    publish = staticmethod(stops.publish_stop)
    read = staticmethod(stops.read_stop)
    mark_done = staticmethod(stops.mark_done)
    count_unhealthy = staticmethod(stops.count_unhealthy)
    count_signalled = staticmethod(departures.signalled)
    left = staticmethod(departures.read_left)
    open_inquiry = staticmethod(inquiry.open_inquiry)

    def __init__(self, rendezvous: Rendezvous, *, peer_timeout: float, membership: bool) -> None:
        self._rendezvous = rendezvous
        self._peer_timeout = peer_timeout
        self._membership = membership  # c10d, not standalone: nodes may join between rounds
        self.current: RoundWatch | None = None  # the latest round's (earlier ones were cancelled with their round)

    def watch(self, rnd: Round, post: Callable[[Event], None]) -> RoundWatch:
        # Only the watching node asks whether nodes wait to join: each ask reads O(N) bytes from the store host.
        self.current = RoundWatch(rnd, post, peer_timeout=self._peer_timeout,
                                  waiting=self._rendezvous.waiting_counter() if self._membership else None,
                                  hosting=self.hosts_store(rnd))
        return self.current

    def record_signal(self, rnd: Round, signal_name: str) -> int:
        return departures.record_signal(rnd, self._rendezvous.job_store(rnd.store), signal_name)

    def mark_left(self, rnd: Round) -> frozenset[int]:
        return departures.mark_left(rnd, rnd.group_rank)

    def hosts_store(self, rnd: Round) -> bool:
        return listens_here(rnd.store_port)  # the store's host: torch's c10d serves it from one of the agents

    def publish_evidence(self, rnd: Round, number: int, evidence: Sequence[RankEvidence]) -> None:
        inquiry.publish_evidence(rnd, number, rnd.group_rank, [evidence_to_dict(e) for e in evidence])

    def collect_evidence(self, rnd: Round, number: int, *, deadline: float) -> tuple[list[RankEvidence], list[int]]:
        """Every node's evidence that came in time, and the nodes that sent none (those that left excepted)."""
        gone = departures.read_left(rnd)
        found = inquiry.collect_evidence(rnd, number, nodes=rnd.group_world_size, deadline=deadline, gone=gone)
        evidence = [e for items in found.values() for e in evidence_list_from_dicts(items)]
        return evidence, [g for g in range(rnd.group_world_size) if g not in found and g not in gone]

    def publish_verdict(self, rnd: Round, number: int, verdict: Verdict) -> Verdict:
        wire = verdict_to_wire(verdict)
        stored = inquiry.publish_verdict(rnd, number, wire)
        # the decider keeps its own, with every rank's evidence, unless another verdict won
        return verdict if stored == wire else verdict_from_dict(stored) or verdict

    def wait_verdict(self, rnd: Round, number: int, *, deadline: float) -> Verdict | None:
        stored = inquiry.wait_verdict(rnd, number, deadline=deadline)
        return verdict_from_dict(stored) if stored is not None else None

    def close(self, *, join: bool) -> None:
        """At exit: a thread in a torch store call at interpreter exit aborts it, so join them (not before
        os._exit)."""
        if self.current is not None:
            self.current.cancel()
            if join:
                self.current.join()
