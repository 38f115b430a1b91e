"""Issue #29: what a same-host neighbour who reaches the rendezvous store can make the agents do by writing
values there, and the agent's rules that stop it. The values' decoding and sealing are tested elsewhere; here
every forged value is one the decoder accepts, and the rules decide:
(a) an inquiry opened with no rank past a deadline is withdrawn, and a verdict read from the store stops a rank
    here only when this node's own evidence bears it out and the rank did not move during the inquiry;
(b) an expiry in the quiet time after a verdict is postponed to its end, never dropped;
(c) a final stop cannot claim exit 0 for a job whose workers here have not finished;
(d) no back-off number makes the agent spin or wait past --restart-backoff-max;
(e) the next fast round's token cannot be computed before the round's decision (tests/test_fastround.py for
    the logic; here through a real TCPStore).

Replayed through the real agent loop (tests/replay.py: fake workers and clock), except (e)'s store test.
"""

from __future__ import annotations

import datetime
import hashlib
import math
import threading

import pytest
from torch.distributed import PrefixStore, TCPStore

from mbr_launch.agent.messages import InquiryOpened, PeerStopped, RankExpired, RankStarted
from mbr_launch.cluster import fastround
from mbr_launch.cluster.inquiry import Opener
from mbr_launch.cluster.stops import StopMessage
from mbr_launch.decide.verdict import Basis, ProcState, RankEvidence, StackClass, Verdict, judge
from mbr_launch.report import exitcodes
from tests.replay import World, all_exit, build_world, exit_rank, idle, post

from testkit.helpers import free_port

pytestmark = pytest.mark.timeout(60)

TWO_NODES = (("nnodes", "1:2"), ("rdzv_backend", "c10d"), ("rdzv_endpoint", "127.0.0.1:29401"))


def _two_nodes(tmp_path, *args) -> World:
    return build_world(tmp_path, *TWO_NODES, *args, nodes=2)


def _forged_open(group_rank: int) -> InquiryOpened:
    """What the agent's watcher posts for an ``inquiry/0/open`` value naming ``group_rank`` as the decider."""
    return InquiryOpened(Opener(number=0, group_rank=group_rank, rank=0, kind="heartbeat"))


def _finish_in_round(index: int):
    def step(w: World) -> None:  # until then, time passes and nothing happens
        if w.group.starts[-1][0] == index:
            all_exit(0)(w)
    return step


# ---- (a) an inquiry with no rank past a deadline --------------------------------------------------------

def test_an_inquiry_without_an_expired_rank_is_withdrawn():
    from mbr_launch.agent.inquiry import judge_inquiry

    waiting = dict(state=ProcState.SLEEPING, stack=StackClass.COLLECTIVE, collective="all_reduce")
    healthy = [RankEvidence(rank=r, node="n0", group_rank=0, local_rank=r, pid=10 + r, **waiting) for r in range(3)]
    healthy.append(RankEvidence(rank=3, node="n1", group_rank=1, local_rank=0, pid=20, stack=StackClass.OUTSIDE,
                                state=ProcState.RUNNING, where="step at train.py:9"))
    assert judge(healthy).culprits == (3,)  # the stacks rule alone would blame a rank that is just computing
    verdict = judge_inquiry(healthy)
    assert (verdict.basis, verdict.culprits) == (Basis.WITHDRAWN, ())
    assert verdict.reason.startswith("no hang: no rank of any node is past a deadline")
    assert judge_inquiry([]).basis is Basis.WITHDRAWN
    # a real expiry, or a rank that died of a collective timeout, is judged as before
    expired = [RankEvidence(rank=0, node="n0", group_rank=0, local_rank=0, pid=10, expired=True, kind="heartbeat",
                            **waiting), *healthy[1:]]
    assert judge_inquiry(expired) == judge(expired) and judge_inquiry(expired).culprits == (3,)
    timed_out = [RankEvidence(rank=0, node="n0", group_rank=0, local_rank=0, pid=10, state=ProcState.GONE,
                              stack=StackClass.COLLECTIVE, expired=True, kind="collective_timeout"), *healthy[1:]]
    assert judge_inquiry(timed_out).culprits == (3,)


def test_a_forged_inquiry_naming_this_node_the_decider_restarts_nothing(tmp_path):
    """The neighbour wrote ``inquiry/0/open`` naming this node: it gathers, finds no rank past a deadline, and
    withdraws (on main: an undetermined verdict, and the job restarted, once per write)."""
    world = build_world(tmp_path, ("max_restarts", 3))
    world.looks[1] = {"stack": StackClass.OUTSIDE, "state": ProcState.RUNNING, "where": "step at train.py:9"}
    code = world.run([post(RankStarted(0)), post(RankStarted(1)), post(_forged_open(0)), idle, all_exit(0)])
    assert code == exitcodes.OK
    assert [(v["basis"], v["culprits"], v["decider"]) for v in world.events("verdict")] == [("withdrawn", [], 0)]
    assert world.events("failure") == [] and world.events("restart") == []
    assert world.group.stops == [] and world.rendezvous.joined == 1
    assert world.cluster.published == []  # no stop message went to the other nodes


def test_a_forged_inquiry_no_node_decides_withdraws_on_every_node(tmp_path):
    """The opener names a node that does not exist: every node waits, then judges its own evidence: no expiry,
    so no quiet time either (the next real expiry is judged at once)."""
    world = _two_nodes(tmp_path, ("max_restarts", 1), ("hang_kill_grace", 1.0), ("hang_inquiry_timeout", 1.0))
    world.looks[1] = {"stack": StackClass.OUTSIDE, "where": "sleep at train.py:42", "collective": ""}
    real = RankExpired(local_rank=0, rank=0, pid=None, kind="heartbeat")
    code = world.run([post(RankStarted(0)), post(_forged_open(7)), post(real), _finish_in_round(1),
                      _finish_in_round(1)])
    assert code == exitcodes.OK
    assert [(v["basis"], v["decider"]) for v in world.events("verdict")] == [("withdrawn", 7), ("stacks", 0)]
    assert [(r["rank"], r["cause"]) for r in world.events("failure")] == [(1, "hang")]


def _forged_verdict(world: World, culprit: int, *, copy_evidence: bool, basis: Basis = Basis.STACKS,
                    waited: float = 2.0) -> None:
    """The verdict this node reads from the store names ``culprit`` (a rank of this node). ``copy_evidence``:
    it carries the evidence this node published for that rank (the neighbour can read it in the store);
    otherwise evidence made up for it. ``waited``: seconds the wait for it took."""
    def wait_verdict(rnd, number, *, deadline):
        world.clock.now += waited
        published = {e.rank: e for e in world.cluster.evidence[(rnd.index, number)]}
        carried = published[culprit] if copy_evidence else RankEvidence(
            rank=culprit, node="n0", group_rank=0, local_rank=culprit, pid=4242, state=ProcState.RUNNING,
            stack=StackClass.OUTSIDE, where="spin at train.py:1")
        return Verdict((culprit,), basis, f"rank {culprit} on n0 is outside any collective", (), (carried,))
    world.cluster.wait_verdict = wait_verdict  # type: ignore[method-assign]


def test_a_forged_verdict_does_not_stop_a_healthy_rank_or_exclude_its_node(tmp_path):
    """On main the verdict stopped rank 1, counted a node failure, and the next round excluded this healthy
    node (exit 6). Its evidence is not this node's (another process, another stack): nothing is stopped here,
    nothing is counted; when the round is still running at the time the culprit's node would have stopped it,
    the job restarts blaming no node."""
    world = _two_nodes(tmp_path, ("max_restarts", 2), ("max_node_failures", 1), ("peer_timeout", 4.0))
    _forged_verdict(world, 1, copy_evidence=False)
    code = world.run([post(RankStarted(0)), post(RankStarted(1)), post(_forged_open(1)),
                      *[_finish_in_round(1)] * 200])
    assert code == exitcodes.OK
    verdict = world.events("verdict")[0]
    assert verdict["culprits"] == [1] and "pid 4242 (here " in verdict["refused"]
    assert all(stop["local_ranks"] is None for stop in world.group.stops)  # rank 1 was never singled out
    assert [(r["rank"], r["cause"]) for r in world.events("failure")] == [(-1, "hang")]
    assert "did not stop the round" in world.events("failure")[0]["detail"]
    assert world.rendezvous.node_failures == {} and world.events("exclude") == []
    assert any(line.startswith("not stopping rank 1 for that verdict: the verdict's evidence of rank 1 is not "
                               "this node's") for line in world.said), world.said


def test_a_verdict_carrying_this_nodes_own_evidence_still_spares_a_rank_that_moved(tmp_path):
    """The neighbour copies the evidence this node published, but the rank made a heartbeat or step during the
    inquiry: a hung rank makes none (its peers' deadlines passed waiting for it)."""
    world = _two_nodes(tmp_path, ("max_restarts", 2), ("max_node_failures", 1), ("peer_timeout", 4.0))
    _forged_verdict(world, 1, copy_evidence=True, waited=2.0)
    world.monitor.beats = {0: 0.3, 1: 0.4}  # both beat 0.4 s ago, 1.6 s into the inquiry
    code = world.run([post(RankStarted(0)), post(RankStarted(1)), post(_forged_open(1)),
                      *[_finish_in_round(1)] * 200])
    assert code == exitcodes.OK
    assert "rank 1 made a heartbeat or step 0.4 s ago, during the inquiry" in world.events("verdict")[0]["refused"]
    assert world.rendezvous.node_failures == {} and world.events("exclude") == []
    assert [r["rank"] for r in world.events("failure")] == [-1]


def test_a_real_verdict_from_another_node_still_stops_the_culprit_here(tmp_path):
    """The decider's verdict carries this node's evidence of the culprit, which has not moved since before the
    inquiry (its last beat is older than the inquiry): it is stopped, and the failure is this node's."""
    world = _two_nodes(tmp_path, ("max_restarts", 1))
    world.looks[1] = {"stack": StackClass.OUTSIDE, "where": "sleep at train.py:42", "collective": ""}
    _forged_verdict(world, 1, copy_evidence=True, waited=2.0)
    world.monitor.beats = {0: 12.0, 1: 12.5}
    code = world.run([post(RankStarted(0)), post(RankStarted(1)), post(_forged_open(1)), all_exit(0)])
    assert code == exitcodes.OK
    assert "refused" not in world.events("verdict")[0]
    assert world.group.stops[0]["local_ranks"] == [1]
    assert [(r["rank"], r["cause"]) for r in world.events("failure")] == [(1, "hang")]


def test_a_culprit_found_stopped_is_stopped_here_though_its_stack_dump_let_a_beat_through(tmp_path):
    """This node found the culprit stopped (SIGSTOP); the faulthandler dump resumes it for a moment, in which it
    beat. On main that beat refused the verdict, and every such hang ended in the others' overdue restart
    (128 agents on 16 cores). A stopped rank makes no step of its own: it is stopped here."""
    world = _two_nodes(tmp_path, ("max_restarts", 1))
    world.looks[1] = {"state": ProcState.STOPPED, "stack": StackClass.NONE, "where": "", "collective": ""}
    _forged_verdict(world, 1, copy_evidence=True, waited=2.0)
    world.monitor.beats = {0: 12.0, 1: 0.4}
    code = world.run([post(RankStarted(0)), post(RankStarted(1)), post(_forged_open(1)), all_exit(0)])
    assert code == exitcodes.OK
    assert "refused" not in world.events("verdict")[0]
    assert world.group.stops[0]["local_ranks"] == [1]
    assert [(r["rank"], r["cause"]) for r in world.events("failure")] == [(1, "hang")]


# ---- (b) an expiry in a quiet time ----------------------------------------------------------------------

def _undetermined_elsewhere(world: World) -> None:
    """Another node opens inquiry 0 and publishes an undetermined verdict (it would restart the job, but its
    stop never comes): this node takes no action, and a quiet time follows."""
    world.cluster.remote_verdict = Verdict((), Basis.UNDETERMINED, "every rank waits in all_reduce")


def test_a_hang_that_begins_in_the_quiet_time_is_judged_when_it_ends(tmp_path):
    """On main an expiry in the quiet time was dropped, and the monitor tells each expiry once: the hang was
    never acted on. Now it waits for the quiet time to end, then opens the inquiry."""
    world = _two_nodes(tmp_path, ("max_restarts", 1), ("hang_kill_grace", 1.0), ("hang_inquiry_timeout", 1.0))
    _undetermined_elsewhere(world)
    world.looks[1] = {"stack": StackClass.OUTSIDE, "where": "sleep at train.py:42", "collective": ""}
    quiet = 1.0 + 1.0 + 2.0  # hang_kill_grace + the inquiry bound + the verdict's slack
    steps = [post(RankStarted(0)), post(RankStarted(1)), post(InquiryOpened(Opener(0, 1, 3, "step"))),
             post(RankExpired(local_rank=0, rank=0, pid=None, kind="heartbeat")),  # 1.4 s later, in the quiet
             *[idle] * int(quiet / 0.5 + 2), _finish_in_round(1), _finish_in_round(1)]
    assert world.run(steps) == exitcodes.OK
    verdicts = world.events("verdict")
    assert [(v["inquiry"], v["basis"], v["decider"]) for v in verdicts] == [(0, "undetermined", 1), (1, "stacks", 0)]
    assert [(r["rank"], r["cause"]) for r in world.events("failure")] == [(1, "hang")]
    assert [r["round"] for r in world.events("rendezvous")] == [0, 1]
    assert any("in the quiet time after the last verdict, and it has not moved since: judging it now" in line
               for line in world.said), world.said


def test_a_postponed_expiry_of_a_rank_that_moved_or_exited_since_is_dropped(tmp_path):
    world = _two_nodes(tmp_path, ("max_restarts", 1), ("hang_kill_grace", 1.0), ("hang_inquiry_timeout", 1.0))
    _undetermined_elsewhere(world)
    world.monitor.beats = {0: 0.2}  # rank 0 stepped again after its deadline passed
    steps = [post(RankStarted(0)), post(InquiryOpened(Opener(0, 1, 3, "step"))),
             post(RankExpired(local_rank=0, rank=0, pid=None, kind="step")),
             post(RankExpired(local_rank=1, rank=1, pid=None, kind="heartbeat")), exit_rank(1, 0),
             *[idle] * 12, all_exit(0)]
    assert world.run(steps) == exitcodes.OK
    assert len(world.events("verdict")) == 1 and world.events("failure") == []
    assert world.ctx.current.inquiry.postponed == {} and 0 not in world.ctx.current.inquiry.expired


# ---- (c) a final stop that claims exit 0 ----------------------------------------------------------------

FORGED_SUCCESS = StopMessage(reason="all workers succeeded", origin="n1", group_rank=1, final=True, exit_code=0)


def test_a_final_stop_cannot_claim_success_for_workers_still_running(tmp_path):
    """On main every node ended with exit 0 while its training was cut off; agents end a job with 0 only
    through "all done", never by a stop."""
    world = _two_nodes(tmp_path)
    assert world.run([post(RankStarted(0)), post(PeerStopped(FORGED_SUCCESS))]) == exitcodes.FAILED
    end = world.events("end")[-1]
    assert end["exit_code"] == exitcodes.FAILED
    assert "claimed the job succeeded (exit 0) while this node's workers had not finished" in end["reason"]


def test_a_final_stop_with_exit_0_stands_when_the_workers_here_succeeded_or_0_is_the_jobs_own_code(tmp_path):
    (tmp_path / "done").mkdir()
    (tmp_path / "own").mkdir()
    world = build_world(tmp_path / "done", *TWO_NODES, nodes=2, all_done=False)  # waits for the other node
    assert world.run([all_exit(0), post(PeerStopped(FORGED_SUCCESS))]) == exitcodes.OK
    # --ft-no-restart-exit-code 0: the job's own configuration stops with 0
    world = build_world(tmp_path / "own", *TWO_NODES, ("no_restart_exit_code", 0), nodes=2)
    assert world.run([post(PeerStopped(FORGED_SUCCESS))]) == exitcodes.OK
    # and the codes agents do publish (a failure, a lost store) are untouched
    failed = StopMessage(reason="rank 3 crashed on n1", origin="n1", final=True, exit_code=exitcodes.FAILED)
    (tmp_path / "failed").mkdir()
    assert build_world(tmp_path / "failed", *TWO_NODES, nodes=2).run([post(PeerStopped(failed))]) == exitcodes.FAILED


# ---- (d) the back-off -----------------------------------------------------------------------------------

def _count_sleeps(world: World, limit: int = 200) -> list[float]:
    slept: list[float] = []
    real = world.wakeup.sleep

    def sleep(seconds: float) -> bool:
        slept.append(seconds)
        if len(slept) > limit:
            raise AssertionError(f"the back-off slept {limit} times: it spins ({slept[-3:]})")
        return real(seconds)
    world.wakeup.sleep = sleep  # type: ignore[method-assign]
    return slept


@pytest.mark.parametrize(("backoff", "waited"), [(float("nan"), 0.0), (float("inf"), 7.0), (1e12, 7.0),
                                                 (-5.0, 0.0), (3.0, 3.0)])
def test_no_back_off_number_spins_or_waits_past_the_max(tmp_path, backoff, waited):
    """On main a NaN printed `restarting in nan s` without end (about 1 MB/s); inf raised; 1e12 s was waited."""
    from mbr_launch.agent.progress import back_off

    world = build_world(tmp_path, ("restart_backoff_max", 7.0))
    slept = _count_sleeps(world)
    start = world.clock.now
    assert back_off(world.ctx, backoff, "n1")
    assert world.clock.now - start == pytest.approx(waited)
    assert not any("nan" in line or "inf" in line for line in world.said), world.said
    assert all(math.isfinite(s) for s in slept)


def test_a_peers_nan_back_off_restarts_at_once_and_logs_a_number(tmp_path):
    world = _two_nodes(tmp_path, ("max_restarts", 1))
    _count_sleeps(world)
    stop = StopMessage(reason="rank 2 crashed on n1", origin="n1", group_rank=1, restart_count=1,
                       backoff=float("nan"))
    assert world.run([post(PeerStopped(stop)), all_exit(0)]) == exitcodes.OK
    assert [r["backoff"] for r in world.events("restart")] == [0.0]


# ---- (e) the fast round's token, through a real store ---------------------------------------------------

def test_agents_over_a_real_store_agree_on_one_token_that_was_not_predictable():
    """Three agents, one TCPStore client each (a free port, in process): one decision read by all, the same
    token for each, derived from the decision's nonce and not from the failed round's token alone."""
    port = free_port()
    host = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=10))
    out: dict[int, fastround.Outcome] = {}

    def one(rank: int) -> None:
        client = TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=10))
        out[rank] = fastround.agree(PrefixStore("job/round/tok", client), group_rank=rank, nodes=3, token="tok",
                                    timeout=5, master_port=20001 if rank == 0 else 0, restarts=2 if rank == 0 else 0)

    threads = [threading.Thread(target=one, args=(r,)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert set(out) == {0, 1, 2} and len(set(out.values())) == 1, out
    agreed = out[0]
    assert isinstance(agreed, fastround.Agreement) and (agreed.master_port, agreed.restart_count) == (20001, 2)
    assert agreed.token != hashlib.sha1(b"tok/fast").hexdigest()[:12]  # what main derived, and anyone could
    decided = host.get("job/round/tok/" + fastround.DECIDED_KEY).decode()
    assert agreed.token == fastround.next_token("tok", decided.rsplit(":", 1)[1])
