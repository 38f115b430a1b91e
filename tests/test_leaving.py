"""Who a stop signal stops and what the round does without a node that left (``decide.leaving``: pure), and the
round's keys that carry it (``cluster.departures``, on torch's in-memory store, with and without the job's
secret); the peer watch's part (it stops watching a node that left) is in tests/test_peers.py."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest
from torch.distributed import HashStore, PrefixStore

from mbr_launch.cluster import departures, storevalue
from mbr_launch.cluster.jobstore import JobStore
from mbr_launch.decide.leaving import (DepartureFacts, Next, Reach, after_departure, reach, window)
from mbr_launch.decide.policy import RestartPolicy, When


def test_the_window_is_half_the_peer_timeout_and_never_below_a_second():
    assert window(15.0) == 7.5 and window(4.0) == 2.0 and window(0.5) == 1.0


@pytest.mark.parametrize("nodes,signalled,waited,expected", [
    (1, 1, 0.0, Reach.JOB),  # one node: its signal is the job's, at once
    (3, 3, 0.0, Reach.JOB),  # every node recorded one: no need to wait
    (3, 2, 0.5, None),  # not yet known
    (3, 2, 2.0, Reach.NODE),  # the window passed: only some nodes
    (3, 1, 9.0, Reach.NODE),
])
def test_reach(nodes, signalled, waited, expected):
    assert reach(nodes=nodes, signalled=signalled, waited=waited, window=2.0) is expected


@pytest.mark.parametrize("signalled,waited", [(1, 0.0), (1, 9.0), (2, 0.5)])
def test_a_signal_slurm_sent_to_the_whole_step_is_the_jobs_whatever_the_count(signalled, waited):
    """However many nodes have recorded theirs yet, and however long ago this one got it."""
    assert reach(nodes=3, signalled=signalled, waited=waited, window=2.0, step_wide=True) is Reach.JOB


ANY = RestartPolicy(min_nodes=2, max_restarts=5)
HEALTHY = RestartPolicy(min_nodes=2, max_restarts=1, when=When.MIN_HEALTHY)


@pytest.mark.parametrize("policy,facts,expected", [
    # any-failed (ft_launcher's table): a spare waits -> the round re-forms with it; none -> the others go on
    (ANY, DepartureFacts(nodes=3, left=1, waiting=1), Next.REFORM),
    (ANY, DepartureFacts(nodes=3, left=1), Next.GO_ON),
    (ANY, DepartureFacts(nodes=3, left=2), Next.STOP),  # 1 < MIN 2 and nobody to take a place
    (ANY, DepartureFacts(nodes=2, left=1, waiting=1), Next.REFORM),  # below MIN, but a spare makes it 2
    (ANY, DepartureFacts(nodes=3, left=1, waiting=1, elastic=False), Next.GO_ON),  # nobody joins a static job
    # min-healthy: go on while MIN nodes are whole; below, restart while the budget lasts
    (HEALTHY, DepartureFacts(nodes=3, left=1, unhealthy=1, waiting=2), Next.GO_ON),  # spares wait for a restart
    (HEALTHY, DepartureFacts(nodes=3, left=1, unhealthy=2), Next.RESTART),
    (HEALTHY, DepartureFacts(nodes=3, left=1, unhealthy=2, restarts_used=1), Next.STOP),
])
def test_after_departure(policy, facts, expected):
    decided = after_departure(policy, facts)
    assert decided.next is expected, decided
    assert decided.exhausted == (expected is Next.STOP and policy is HEALTHY)


@dataclass
class _Round:
    control: PrefixStore
    control_prefix: str = "job/round/t0"
    group_world_size: int = 4
    group_rank: int = 0
    sealer: storevalue.Sealer = field(default_factory=storevalue.Sealer)


@pytest.fixture(params=[None, b"s3cret"], ids=["plain", "sealed"])
def sealer(request):
    return request.param  # the job's secret (None: none)


def test_departures_and_signals_in_the_round_store(sealer):
    base = HashStore()
    rnd = _Round(control=PrefixStore("job/round/t0", base), sealer=storevalue.Sealer(sealer))
    job = JobStore(PrefixStore("job", base), None, rnd.sealer)
    assert departures.read_left(rnd) == frozenset() and departures.signalled(rnd) == 0
    assert departures.mark_left(rnd, 2) == {2}
    assert departures.mark_left(rnd, 0) == {0, 2}
    assert departures.read_left(rnd) == {0, 2}
    for count in (1, 2, 3):
        assert departures.record_signal(rnd, job, "SIGTERM") == count
        assert not job.check([departures.JOB_STOP_KEY])  # not every node yet: no mark for the spares
    assert departures.record_signal(rnd, job, "SIGTERM") == 4
    mark = job.read(departures.JOB_STOP_KEY)
    assert departures.job_stopped(mark) == "SIGTERM"


def test_a_hostile_departures_value_is_none(sealer):
    base = HashStore()
    rnd = _Round(control=PrefixStore("job/round/t0", base), sealer=storevalue.Sealer(sealer))
    # Without the job's secret anyone who reaches the store may write (documented): what is read is bounded to
    # the round's group ranks. With it, nothing without the seal is read.
    for raw, plain in ((b"[0, 1, 99, -1, true]", {0, 1}), (json.dumps(list(range(10**5))).encode(), {0, 1, 2, 3}),
                       (json.dumps(list(range(10**6))).encode(), set()),  # over the bound on what is read
                       (b"{", set()), (b"\xff" * 64, set()), (b'{"0": 1}', set())):
        rnd.control.set(departures.LEFT_KEY, raw)
        assert departures.read_left(rnd) == (set() if sealer else plain), raw[:20]
    rnd.control.set(departures.LEFT_KEY, b"[0, 1, 99, -1, true]")
    assert departures.mark_left(rnd, 3) == ({3} if sealer else {0, 1, 3})  # a forgery is replaced, not kept
    assert departures.job_stopped(b"rm -rf /") is None and departures.job_stopped(None) is None


def test_a_hang_inquiry_waits_for_no_node_that_left():
    """A node that left the round sends no evidence: it is neither waited for nor counted as silent."""
    import datetime
    import time
    from types import SimpleNamespace

    from torch.distributed import TCPStore

    from mbr_launch.agent.watch import StoreCluster
    from mbr_launch.cluster import inquiry

    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=5))
    prefix = "mbr/job/j/round/t1"
    rnd = SimpleNamespace(control=PrefixStore(prefix, server), control_prefix=prefix, group_world_size=3, group_rank=0,
                          sealer=storevalue.Sealer())
    inquiry.publish_evidence(rnd, 0, 0, [{"rank": 0}])
    inquiry.publish_evidence(rnd, 0, 1, [{"rank": 1}])
    departures.mark_left(rnd, 2)
    cluster = StoreCluster(None, peer_timeout=4.0, membership=False)  # type: ignore[arg-type]
    began = time.monotonic()
    _evidence, missing = cluster.collect_evidence(rnd, 0, deadline=began + 30)  # type: ignore[arg-type]
    assert missing == [] and time.monotonic() - began < 30  # the wait ended with the last node still in
