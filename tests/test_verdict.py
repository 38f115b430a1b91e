"""The job-wide hang verdict as a pure function: every rank's evidence in, the culprit (or why none) out."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest

from mbr_launch.decide.verdict import (Basis, GroupProgress, ProcState, RankEvidence, StackClass, Verdict,
                                       judge)
from mbr_launch.decide.verdict_codec import (MAX_RANKS, evidence_from_dict, evidence_list_from_dicts,
                                             evidence_to_dict, verdict_from_dict, verdict_to_wire)
from mbr_launch.decide.verdict_text import compress_ranks

pytestmark = pytest.mark.timeout(10)

COLL, OUT, NONE = StackClass.COLLECTIVE, StackClass.OUTSIDE, StackClass.NONE
ALL_REDUCE = "all_reduce at distributed_c10d.py:2806"


def ev(rank: int, node: str = "n0", *, state: ProcState = ProcState.SLEEPING, stack: StackClass = COLL,
       where: str = "", progress: tuple[GroupProgress, ...] = (), **kw) -> RankEvidence:
    if stack is COLL:
        where = where or ALL_REDUCE
        kw.setdefault("collective", "all_reduce")
    return RankEvidence(rank=rank, node=node, group_rank=0, local_rank=rank, pid=1000 + rank, state=state,
                        stack=stack, where=where, progress=progress, **kw)


def pg(enqueued: int, completed: int | None = None, *, pg_id: str = "0", op: str = "gloo:all_reduce",
       ranks: tuple[int, ...] = (), started: int = -1) -> GroupProgress:
    """gloo-like counters: no "started"; a rank waiting in #n has enqueued n and completed n - 1."""
    return GroupProgress(pg=pg_id, enqueued=enqueued, started=started,
                         completed=enqueued - 1 if completed is None else completed, ranks=ranks, last_op=op)


def verdict_to_dict(v: Verdict) -> dict:
    """A verdict with every rank's evidence, as ``verdict_from_dict`` reads it (the store carries the shorter
    ``verdict_to_wire``)."""
    return {"culprits": list(v.culprits), "basis": v.basis.value, "reason": v.reason, "waiting": list(v.waiting),
            "evidence": [evidence_to_dict(e) for e in v.evidence]}


def done(enqueued: int, **kw) -> GroupProgress:
    """Counters of a rank with nothing pending (between collectives)."""
    return pg(enqueued, enqueued, **kw)


# ---- rule a: stopped, uninterruptible, silent ----------------------------------------------------------

def test_sigstopped_rank_while_peers_wait():
    ranks = [ev(r, progress=(pg(183),)) for r in (0, 2, 3)]
    ranks.append(ev(1, state=ProcState.STOPPED, stack=NONE))  # a stopped rank gives no stack and no dump
    v = judge(ranks)
    assert (v.culprits, v.basis, v.waiting) == ((1,), Basis.STOPPED, (0, 2, 3))
    assert v.reason == ("rank 1 on n0 is stopped (SIGSTOP or a debugger: process state T); "
                        "ranks 0,2,3 wait in all_reduce #183 of process group 0")


def test_uninterruptible_rank_beats_counters():
    v = judge([ev(0, progress=(pg(10),)), ev(1, state=ProcState.DISK, stack=NONE), ev(2, progress=(done(9),),
                                                                                      stack=OUT)])
    assert (v.culprits, v.basis) == ((1,), Basis.STOPPED)
    assert "process state D" in v.reason


def test_silent_rank_is_evidence_but_not_when_everyone_is_silent():
    silent = ev(2, "n1", state=ProcState.UNKNOWN, stack=NONE)
    v = judge([ev(0), ev(1), silent])
    assert (v.culprits, v.basis) == ((2,), Basis.STOPPED)
    assert v.reason.startswith("rank 2 on n1 gave no evidence")
    gone = [ev(r, state=ProcState.GONE, stack=NONE) for r in range(3)]
    v = judge(gone)
    assert not v.determined and v.basis is Basis.UNDETERMINED and "no evidence from any rank" in v.reason


def test_exited_ranks_are_not_blamed_for_a_hang():
    # a zombie has exited: its crash is handled as a crash; nor does it count as a rank "with evidence"
    v = judge([ev(0, state=ProcState.ZOMBIE, stack=NONE), ev(1, state=ProcState.GONE, stack=NONE)])
    assert not v.determined
    v = judge([ev(0, state=ProcState.ZOMBIE, stack=NONE), ev(1), ev(2)])
    assert not v.determined


# ---- rule b: Flight Recorder progress ------------------------------------------------------------------

def test_culprit_on_another_node_is_behind():
    ranks = [ev(r, "n0", progress=(pg(183),)) for r in range(3)]
    ranks.append(ev(3, "n1", progress=(done(182),), stack=NONE))  # no stack: the counters alone decide
    v = judge(ranks)
    assert (v.culprits, v.basis, v.waiting) == ((3,), Basis.PROGRESS, (0, 1, 2))
    assert v.reason == ("rank 3 on n1 is behind: 182 collectives enqueued in process group 0 against 183 on "
                        "ranks 0-2 (waiting in all_reduce #183)")


def test_counters_and_stacks_agree_on_a_sleeping_rank():
    v = judge([ev(0, progress=(pg(5),)), ev(1, stack=OUT, where="sleep at train.py:42", progress=(done(4),))])
    assert (v.culprits, v.basis) == ((1,), Basis.PROGRESS)
    assert "stacks point" not in v.reason


def test_rank_in_a_different_collective_than_its_peers():
    # rank 3 called a broadcast on process group 1 before the all_reduce its peers wait in on group 0: behind
    # in group 0, ahead in group 1, so the wait-for relation is a cycle; it is the odd one out in both
    peers = [ev(r, progress=(pg(10), done(5, pg_id="1"))) for r in range(3)]
    odd = ev(3, "n1", collective="broadcast", where="broadcast at distributed_c10d.py:2500",
             progress=(done(9), pg(6, pg_id="1", op="gloo:broadcast")))
    v = judge(peers + [odd])
    assert (v.culprits, v.basis) == ((3,), Basis.PROGRESS)
    assert v.reason.startswith("rank 3 on n1 is behind: 9 collectives enqueued in process group 0 against 10")
    assert v.waiting == (0, 1, 2)


def test_pipeline_chain_names_the_end_of_the_chain():
    # stage 0 waits for stage 1 (group "a"), which waits for stage 2 (group "b"), which sits outside any
    v = judge([ev(0, progress=(pg(7, pg_id="a", ranks=(0, 1)),)),
               ev(1, progress=(done(6, pg_id="a", ranks=(0, 1)), pg(7, pg_id="b", ranks=(1, 2)))),
               ev(2, stack=OUT, where="loss at model.py:88", progress=(done(6, pg_id="b", ranks=(1, 2)),))])
    assert (v.culprits, v.basis, v.waiting) == ((2,), Basis.PROGRESS, (0, 1))


def test_subgroups_sharing_an_id_are_not_compared():
    # one DP group per TP rank, both called "1" in their own ranks' dumps: counts differ, nobody is behind
    v = judge([ev(0, progress=(pg(40, pg_id="1", ranks=(0, 2)),)), ev(2, progress=(pg(40, pg_id="1", ranks=(0, 2)),)),
               ev(1, progress=(pg(12, pg_id="1", ranks=(1, 3)),)), ev(3, progress=(pg(12, pg_id="1", ranks=(1, 3)),))])
    assert not v.determined


def test_missing_dump_is_not_behind():
    ranks = [ev(r, progress=(pg(183),)) for r in range(3)] + [ev(3)]  # rank 3 in a collective, no dump
    v = judge(ranks)
    assert (v.culprits, v.basis) == ((), Basis.UNDETERMINED)
    assert v.reason == ("every rank waits in a collective (ranks 0-2 wait in all_reduce #183 of process group 0; "
                        "rank 3 waits in all_reduce); no Flight Recorder dump from rank 3 to compare, no rank to blame")
    ranks[3] = ev(3, stack=OUT, where="save at ckpt.py:7")  # its stack still speaks
    assert (judge(ranks).culprits, judge(ranks).basis) == ((3,), Basis.STACKS)


def test_leaders_that_do_not_wait_are_just_ahead():
    # rank 0 finished #5 and runs outside any collective: rank 1 being at 4 is no hang in this group
    v = judge([ev(0, stack=OUT, progress=(done(5),)), ev(1, stack=OUT, progress=(done(4),))])
    assert v.basis is not Basis.PROGRESS


def test_counters_beat_stacks_and_say_so():
    # rank 1 is behind in group 0 and sits in a store call (a "collective" stack); rank 2's stack sample
    # caught it between two waits
    v = judge([ev(0, progress=(pg(50),)), ev(1, collective="store.get", progress=(done(49),)),
               ev(2, stack=OUT, where="step at train.py:10", progress=(pg(50),)), ev(3, progress=(pg(50),))])
    assert (v.culprits, v.basis) == ((1,), Basis.PROGRESS)
    assert "the stacks point at rank 2 instead" in v.reason


# ---- rule c: stacks ------------------------------------------------------------------------------------

def test_sleeping_rank_outside_while_peer_waits_in_all_reduce():
    v = judge([ev(0, expired=True, kind="heartbeat"), ev(1, stack=OUT, where="sleep at train.py:42")])
    assert (v.culprits, v.basis, v.waiting) == ((1,), Basis.STACKS, (0,))  # not rank 0, whose deadline fired
    assert v.reason == "rank 1 on n0 is outside any collective (in `sleep at train.py:42`); rank 0 waits in all_reduce"


def test_busy_loop_holding_the_gil():
    v = judge([ev(0), ev(1, state=ProcState.RUNNING, cpu=1.0, stack=OUT, where="spin at train.py:9"), ev(2)])
    assert (v.culprits, v.basis) == ((1,), Basis.STACKS)
    assert "(in `spin at train.py:9`, busy at 100% of a CPU)" in v.reason


def test_eight_ranks_one_stuck_in_the_dataloader():
    ranks = [ev(r, "n1" if r < 4 else "n2", progress=(pg(183),)) for r in range(8) if r != 5]
    ranks.append(ev(5, "n2", stack=OUT, where="__next__ at dataloader.py:631"))  # its dump did not come
    v = judge(ranks)
    assert (v.culprits, v.basis, v.waiting) == ((5,), Basis.STACKS, (0, 1, 2, 3, 4, 6, 7))
    assert v.reason == ("rank 5 on n2 is outside any collective (in `__next__ at dataloader.py:631`); "
                        "ranks 0-4,6,7 wait in all_reduce #183 of process group 0")


def test_independent_workers_all_outside_fall_through():
    v = judge([ev(r, stack=OUT, where=f"work at job.py:{r}") for r in range(3)])
    assert not v.determined and "every rank is outside any collective" in v.reason


# ---- rule d: the only expired rank ---------------------------------------------------------------------

def test_only_expired_rank_among_independent_workers():
    ranks = [ev(r, stack=OUT) for r in (0, 1, 3)]
    ranks.append(ev(2, "n1", stack=OUT, where="read at io.py:5", expired=True, kind="section", section="step"))
    v = judge(ranks)
    assert (v.culprits, v.basis) == ((2,), Basis.ONLY_EXPIRED)
    assert v.reason == ("rank 2 on n1 is the only rank past its section deadline (in section 'step', in "
                        "`read at io.py:5`); ranks 0,1,3 run outside any collective")


def test_first_expiry_alone_names_nobody():
    # no stacks and no dumps: the peer that has not expired yet may be blocked on the expired one (the
    # measured bug: the deadline that fires first names a rank at random)
    v = judge([ev(0, stack=NONE, expired=True), ev(1, stack=NONE)])
    assert not v.determined
    v = judge([ev(0, stack=OUT, expired=True), ev(1, stack=OUT, expired=True), ev(2, stack=OUT)])
    assert not v.determined and "ranks 0,1 past a deadline" in v.reason


def test_single_rank_job():
    v = judge([ev(0, stack=OUT, expired=True)])
    assert (v.culprits, v.basis) == ((0,), Basis.ONLY_EXPIRED)
    assert judge([ev(0, state=ProcState.STOPPED, stack=NONE)]).culprits == (0,)


# ---- rule e and the majority rule ----------------------------------------------------------------------

def test_everyone_waits_with_equal_counts_is_a_communication_hang():
    v = judge([ev(r, "n0" if r < 4 else "n1", progress=(pg(183),)) for r in range(8)])
    assert (v.culprits, v.basis) == ((), Basis.UNDETERMINED)
    assert v.reason == "every rank waits in all_reduce #183 of process group 0: a communication hang, no rank to blame"
    assert v.waiting == tuple(range(8))


def test_majority_of_culprits_is_undetermined():
    v = judge([ev(0), ev(1, stack=OUT), ev(2, stack=OUT)])
    assert (v.culprits, v.basis) == ((), Basis.UNDETERMINED)
    assert v.reason.startswith("2 of 3 ranks would be culprits (stacks: ranks 1,2)")
    stopped = [ev(r, state=ProcState.STOPPED, stack=NONE) for r in range(3)] + [ev(3), ev(4)]
    assert not judge(stopped).determined
    assert judge(stopped[:2] + [ev(3), ev(4)]).culprits == (0, 1)  # two of four: not a majority


def test_no_evidence_at_all():
    assert judge([]).basis is Basis.UNDETERMINED
    assert not judge([]).determined


def test_order_and_duplicates_do_not_change_the_verdict():
    ranks = [ev(r, progress=(pg(183),)) for r in range(7)] + [ev(7, "n1", stack=OUT, progress=(done(182),))]
    expected = judge(ranks)
    shuffled = ranks[:]
    random.Random(4).shuffle(shuffled)
    again = judge(shuffled + [ev(7, "n1")])  # a late duplicate of rank 7 is ignored
    assert (again.culprits, again.reason, again.waiting) == (expected.culprits, expected.reason, expected.waiting)


def test_compress_ranks():
    assert compress_ranks([0, 1, 2, 3, 4, 6, 7]) == "0-4,6,7"
    assert compress_ranks([3, 1, 2, 2]) == "1-3"
    assert compress_ranks([0, 2, 4]) == "0,2,4"
    assert compress_ranks([5]) == "5"
    assert compress_ranks([]) == ""


# ---- NVRx in-process restart: deadlines that pass while the Wrapper restarts the wrapped function ----------

RESTARTING = StackClass.RESTARTING
IN_WRAPPER = {"stack": RESTARTING, "where": "reentrant_barrier at store.py:295", "collective": "in-process restart"}


def test_deadlines_passed_during_an_in_process_restart_are_withdrawn():
    """gloo timed out the ranks that waited for the failed one; the Wrapper restarts them all (on CPU that takes
    about the collective timeout), their heartbeats stop meanwhile, some pass 12 s."""
    v = judge([ev(0, expired=True, **IN_WRAPPER), ev(1, expired=True, watched=True, stack=OUT, where="train at x.py:9"),
               ev(2, **IN_WRAPPER), ev(3, stack=OUT, where="train at x.py:255")])
    assert (v.culprits, v.basis, v.determined) == ((), Basis.WITHDRAWN, False)
    assert v.reason == ("no hang: the deadlines passed during an in-process restart (rank 1 initialised its client "
                        "again; rank 0 is in the NVRx in-process restart)")


def test_a_passed_step_deadline_is_never_withdrawn():
    """The zero-code step timeout: the monitor row of a rank without a client stays "armed" (with one,
    "monitoring") all along, which is no new client session: the hang is judged, not withdrawn."""
    v = judge([ev(0, expired=True, watched=True, kind="step", stack=OUT, where="train at x.py:9 (in sleep)"),
               ev(1, watched=True, stack=COLL, where="all_reduce at x.py:12")])
    assert v.basis is not Basis.WITHDRAWN and v.culprits == (0,), v


def test_expired_ranks_that_exited_since_leave_their_exit_to_the_crash_path():
    """Two ranks SIGKILLed after their deadline passed: no hang verdict on top of their crash."""
    gone = {"state": ProcState.GONE, "stack": NONE}
    v = judge([ev(0, expired=True, watched=True, stack=OUT), ev(4, expired=True, **gone), ev(5, expired=True, **gone)])
    assert v.basis is Basis.WITHDRAWN and v.reason.endswith("ranks 4,5 exited (handled as a crash))"), v.reason
    assert judge([ev(0, expired=True, **gone), ev(1, expired=True, stack=OUT)]).basis is not Basis.WITHDRAWN


def test_a_rank_that_never_rejoins_the_in_process_restart_is_the_culprit():
    """The others wait in the Wrapper's restart barrier for the rank asleep in the script: not withdrawn."""
    sleeper = ev(5, expired=True, stack=OUT, where="_maybe_simulate_fault at x.py:120 (in sleep)")
    v = judge([ev(r, expired=True, **IN_WRAPPER) for r in range(5)] + [sleeper])
    assert (v.culprits, v.basis, v.waiting) == ((5,), Basis.STACKS, (0, 1, 2, 3, 4))
    assert v.reason == ("rank 5 on n0 is outside any collective (in `_maybe_simulate_fault at x.py:120 (in sleep)`); "
                        "ranks 0-4 wait in in-process restart")
    behind = judge([ev(r, expired=True, progress=(pg(338),), **IN_WRAPPER) for r in range(5)]
                   + [dataclasses.replace(sleeper, progress=(done(337),))])
    assert (behind.culprits, behind.basis) == ((5,), Basis.PROGRESS)


def test_a_stopped_rank_is_blamed_even_while_the_others_restart_in_process():
    v = judge([ev(0, expired=True, **IN_WRAPPER), ev(1, state=ProcState.STOPPED, stack=NONE)])
    assert (v.culprits, v.basis) == ((1,), Basis.STOPPED)


def test_a_watched_rank_whose_deadline_never_passed_withdraws_nothing():
    v = judge([ev(0, watched=True, stack=OUT, where="sleep at x.py:1"), ev(1, expired=True, stack=OUT),
               ev(2, watched=True)])
    assert v.basis is not Basis.WITHDRAWN


def test_a_withdrawn_verdict_survives_the_store():
    v = judge([ev(0, expired=True, **IN_WRAPPER), ev(1, expired=True, watched=True)])
    back = verdict_from_dict(json.loads(json.dumps(verdict_to_dict(v))))
    assert v.basis is Basis.WITHDRAWN and back == v and back.evidence == v.evidence
    assert [(e.watched, e.stack) for e in back.evidence] == [(False, RESTARTING), (True, COLL)]


# ---- dicts for the store -------------------------------------------------------------------------------

FULL = RankEvidence(rank=3, node="n1", group_rank=1, local_rank=1, pid=4242, state=ProcState.RUNNING, cpu=0.97,
                    stack=OUT, where="spin at train.py:9", collective="",
                    progress=(GroupProgress("0", 182, 182, 182, (0, 1, 2, 3), "nccl:all_reduce"),
                              GroupProgress("1", -1, -1, -1)),
                    expired=True, kind="step", section="step", last_heartbeat_age=5.5, steps=41,
                    stacks_path="/tmp/x/stacks-3.txt")


def test_evidence_round_trip_through_json():
    assert evidence_from_dict(json.loads(json.dumps(evidence_to_dict(FULL)))) == FULL
    plain = ev(0)
    assert evidence_from_dict(json.loads(json.dumps(evidence_to_dict(plain)))) == plain


def test_verdict_round_trip_through_json():
    v = judge([ev(0, progress=(pg(5),)), FULL, ev(1), ev(2)])
    back = verdict_from_dict(json.loads(json.dumps(verdict_to_dict(v))))
    assert back == v and back.evidence == v.evidence and back.culprits == (3,)
    undetermined = judge([ev(0), ev(1)])
    assert verdict_from_dict(verdict_to_dict(undetermined)) == undetermined


def test_the_verdict_other_nodes_read_carries_the_culprits_evidence_and_is_small_at_any_size():
    def wire(n: int) -> tuple[Verdict, Verdict, int]:
        v = judge([ev(r, stack=OUT, where="sleep at train.py:9") if r == 17 else ev(r) for r in range(n)])
        text = json.dumps(verdict_to_wire(v))
        return v, verdict_from_dict(json.loads(text)), len(text)

    v, back, small = wire(32)
    assert back.culprits == v.culprits == (17,) and back.basis is v.basis and back.reason == v.reason
    assert back.waiting == v.waiting and len(v.waiting) == 31
    assert back.evidence == tuple(e for e in v.evidence if e.rank == 17)
    v4096, back4096, large = wire(2048)
    assert back4096.waiting == v4096.waiting and back4096.culprits == (17,)
    assert large < small + 64 < 2048  # the waiting ranks as ranges: "0-16,18-2047"
    assert len(json.dumps(verdict_to_dict(v4096))) > 1000 * large  # every rank's evidence, as it was


@pytest.mark.parametrize(("text", "ranks"), [
    ("0-3,7", (0, 1, 2, 3, 7)), ("", ()), ("5", (5,)), ("x,1-y,2,-3,4-", (2,)), ("3-1", ()),
    ("99999999-100000000", ()),  # numbers past any job's ranks are skipped
])
def test_waiting_ranges_from_the_store_are_read_safely(text, ranks):
    assert verdict_from_dict({"basis": "undetermined", "waiting": text}).waiting == ranks


def test_a_forged_range_cannot_expand_without_bound():
    waiting = verdict_from_dict({"basis": "undetermined", "waiting": "0-9999999,0-9999999"}).waiting
    assert len(waiting) == MAX_RANKS


@pytest.mark.parametrize("junk", [None, 3, "x", [], {}, {"rank": "3"}, {"rank": True}, {"rank": -1}, {"node": "n0"}])
def test_unreadable_evidence_is_skipped(junk):
    assert evidence_from_dict(junk) is None
    assert evidence_list_from_dicts([junk, evidence_to_dict(FULL)]) == (FULL,)


def test_invalid_fields_fall_back_to_defaults():
    d = {"rank": 2, "node": 7, "pid": "12", "state": "weird", "stack": ["collective"], "cpu": float("nan"),
         "expired": "yes", "section": 5, "steps": 1.5, "last_heartbeat_age": "old",
         "progress": [{"pg": "0", "enqueued": "9", "completed": 3, "ranks": [0, "1", -2, 3, True]}, {"pg": 0}, 7]}
    e = evidence_from_dict(d)
    assert e == RankEvidence(rank=2, node="", group_rank=-1, local_rank=-1, pid=None, state=ProcState.UNKNOWN,
                             stack=NONE, progress=(GroupProgress("0", -1, -1, 3, (0, 3)),))
    assert evidence_list_from_dicts("not a list") == ()


def test_malformed_verdicts():
    assert verdict_from_dict(None) is None and verdict_from_dict([1]) is None
    v = verdict_from_dict({"culprits": [1], "basis": "telepathy", "reason": "r"})
    assert v == Verdict((), Basis.UNDETERMINED, "r")  # a rule we cannot name blames nobody
    v = verdict_from_dict({"culprits": "1", "basis": "stacks", "reason": None, "waiting": [0, "x"],
                           "evidence": [{"rank": 0}, "junk"]})
    assert (v.culprits, v.basis, v.reason, v.waiting, len(v.evidence)) == ((), Basis.UNDETERMINED, "", (0,), 1)
    v = verdict_from_dict({"culprits": [5, "5"], "basis": "progress", "reason": "rank 5 ..."})
    assert (v.culprits, v.basis) == ((5,), Basis.PROGRESS)


# ---- the job-wide stall --------------------------------------------------------------------------------

CKPT = "save at ckpt.py:88"


def test_every_rank_stalled_at_the_same_place_blames_no_rank():
    """What real training code found: every rank sleeps alike in a checkpoint write outside any collective;
    rank 0's step deadline fires first. Rank 0 was blamed (rule d) and its node charged; the verdict is now
    a job-wide stall naming the place."""
    v = judge([ev(0, stack=OUT, where=CKPT, expired=True, kind="step", last_heartbeat_age=10.4),
               ev(1, stack=OUT, where=CKPT, last_heartbeat_age=10.3)])
    assert (v.culprits, v.basis, v.determined) == ((), Basis.JOB_STALL, False)
    assert v.reason == ("every rank is in `save at ckpt.py:88` (ranks 0,1; rank 0 past a deadline; last heartbeat "
                        "0: 10 s, 1: 10 s ago): a job-wide stall (a shared file system, a checkpoint write?), no "
                        "rank or node to blame")


def test_every_heartbeat_old_is_a_job_stall_even_at_different_places():
    v = judge([ev(0, stack=OUT, where="write at io.py:5", expired=True, last_heartbeat_age=30.0),
               ev(1, stack=OUT, where="flush at io.py:9", last_heartbeat_age=29.0),
               ev(2, "n1", stack=OUT, where="fsync at io.py:12", last_heartbeat_age=16.0)])
    assert (v.culprits, v.basis) == ((), Basis.JOB_STALL)
    assert v.reason.startswith("every rank is outside any collective (ranks 0-2; rank 0 past a deadline")


def test_a_fresh_heartbeat_means_not_everyone_stalled():
    # the same line on every rank, but rank 1 keeps beating: it progresses, rank 0 alone is stuck (rule d)
    v = judge([ev(0, stack=OUT, where=CKPT, expired=True, last_heartbeat_age=12.0),
               ev(1, stack=OUT, where=CKPT, last_heartbeat_age=0.2)])
    assert (v.culprits, v.basis) == ((0,), Basis.ONLY_EXPIRED)


def test_different_places_without_heartbeat_ages_stay_with_rule_d():
    v = judge([ev(0, stack=OUT, where="read at io.py:5", expired=True),
               ev(1, stack=OUT, where="work at job.py:1")])
    assert (v.culprits, v.basis) == ((0,), Basis.ONLY_EXPIRED)


def test_a_stall_beside_a_rank_waiting_in_a_collective_is_no_job_stall():
    v = judge([ev(0, stack=OUT, where=CKPT, expired=True, last_heartbeat_age=10.0),
               ev(1, stack=COLL, last_heartbeat_age=10.0)])
    assert (v.culprits, v.basis) == ((0,), Basis.STACKS)


def test_real_clients_failure_shapes():
    """The shapes Lightning, HF Trainer and plain DDP with DCP gave on 2 CPU ranks: a culprit sleeping outside
    while its peer waits in the gloo all-reduce, a SIGSTOPped culprit (no stack, no dump), a culprit stuck in
    its DataLoader, and every rank stalled in the same save."""
    sleeping = judge([ev(0, stack=COLL, last_heartbeat_age=11.0, expired=True),
                      ev(1, stack=OUT, where="sleep at train.py:42", last_heartbeat_age=11.2)])
    assert (sleeping.culprits, sleeping.basis) == ((1,), Basis.STACKS)
    stopped = judge([ev(0, stack=COLL, expired=True, last_heartbeat_age=11.0),
                     ev(1, state=ProcState.STOPPED, stack=NONE)])
    assert (stopped.culprits, stopped.basis) == ((1,), Basis.STOPPED)
    loader = judge([ev(0, stack=COLL, expired=True),
                    ev(1, stack=OUT, where="_recv at multiprocessing/connection.py:430 (DataLoader)")])
    assert (loader.culprits, loader.basis) == ((1,), Basis.STACKS)
    everyone = judge([ev(r, stack=OUT, where="write at filesystem.py:60 (torch.distributed.checkpoint)",
                         expired=r == 1, last_heartbeat_age=10.0 + r) for r in range(2)])
    assert (everyone.culprits, everyone.basis) == ((), Basis.JOB_STALL)


def test_a_job_stall_survives_the_store_and_culprits_smuggled_into_it_are_dropped():
    v = judge([ev(0, stack=OUT, where=CKPT, expired=True, last_heartbeat_age=10.4),
               ev(1, stack=OUT, where=CKPT, last_heartbeat_age=10.3)])
    back = verdict_from_dict(json.loads(json.dumps(verdict_to_dict(v))))
    assert (back.basis, back.culprits, back.reason) == (Basis.JOB_STALL, (), v.reason)
    hostile = dict(verdict_to_dict(v), culprits=[1])
    assert verdict_from_dict(hostile).culprits == ()
