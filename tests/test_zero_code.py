"""Zero-code resiliency: a plain SGD script with no resiliency code, under mbr-launch (gloo, 2 ranks)."""

from __future__ import annotations

import re
import statistics
from datetime import datetime
from pathlib import Path

import pytest


from testkit.helpers import SCRIPTS, run_events, run_launcher

PLAIN = str(SCRIPTS / "plain_sgd.py")
STEP_TIMEOUT = 2.0
SLACK = 0.5
pytestmark = [pytest.mark.timeout(200), pytest.mark.processes]


def _goodput_ok(events: list[dict], stderr: str, failures: int) -> dict:
    (good,) = [e for e in events if e["event"] == "goodput"]
    end = events[-1]
    assert end["event"] == "end"
    seconds = good["seconds"]
    assert 0 < seconds["productive"] < good["wall"] <= end["seconds"] + 0.1
    assert sum(seconds.values()) == pytest.approx(good["wall"], abs=0.05)  # fractions sum to 1
    assert good["goodput"] == pytest.approx(seconds["productive"] / good["wall"], abs=1e-3)
    assert seconds["startup"] > 0
    assert len(good["failures"]) == failures
    match = re.search(r"Goodput: ([0-9.]+)% \(([0-9.]+) s of productive steps in ([0-9.]+) s", stderr)
    assert match, stderr
    return good


def test_sleeping_rank_is_caught_by_step_heartbeats_and_restarted(tmp_path):
    res = run_launcher(["--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--log-dir", str(tmp_path),
                        "--step-timeout", str(STEP_TIMEOUT), "--stack-dump", "faulthandler", "--hang-kill-grace", "1",
                        "--status", "plain", "--status-interval", "2", "--skip-check", "all",
                        PLAIN, "--steps", "60", "--sleep-rank", "1", "--sleep-at-step", "30"], timeout=180)
    assert res.returncode == 0, res.stderr
    events = run_events(tmp_path)
    (hang,) = [e for e in events if e["event"] == "hang"]
    # in synchronous training both ranks stop stepping together; either may be named, the stacks tell
    assert hang["kind"] == "step" and hang["rank"] in (0, 1)
    assert STEP_TIMEOUT <= hang["elapsed"] <= STEP_TIMEOUT + SLACK, hang
    slept = float(re.search(r"rank 1 sleeping at step 30 at ([0-9.]+)", res.stdout).group(1))
    assert datetime.fromisoformat(hang["ts"]).timestamp() - slept <= STEP_TIMEOUT + SLACK + 0.1
    (stacks,) = [e for e in events if e["event"] == "stacks"]
    sleeper = next(p for p in stacks["paths"] if p.endswith("rank1.txt"))
    assert "sleep_now" in Path(sleeper).read_text()
    assert [e["restart_count"] for e in events if e["event"] == "restart"] == [1]
    assert res.stdout.count("restart 1 done 60 steps") == 2
    assert "finished no optimizer step" in res.stderr  # the deadline that opened the inquiry
    # the verdict names the sleeping rank, whichever rank's deadline passed first
    (verdict,) = [e for e in events if e["event"] == "verdict"]
    assert verdict["culprits"] == [1] and verdict["basis"] in ("progress", "stacks"), verdict
    assert [e["rank"] for e in events if e["event"] == "failure"] == [1]
    assert "status: 2 ranks" in res.stderr  # plain status lines (one summary line) when not a terminal
    first_steps = [e for e in events if e["event"] == "first_step"]
    assert sorted((e["round"], e["rank"]) for e in first_steps) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    good = _goodput_ok(events, res.stderr, failures=1)
    failure = good["failures"][0]
    assert failure["cause"] == "hang" and failure["lost"] > 0  # no checkpoints: attempt 0's steps are lost
    assert STEP_TIMEOUT - 0.2 <= failure["detection"] <= STEP_TIMEOUT + 3.0  # + stack dump and stop
    assert failure["restart"] > 0 and good["seconds"]["restart"] > 0
    assert "failure 1 (round 0, hang)" in res.stderr


def test_slow_rank_is_reported_as_a_straggler(tmp_path):
    res = run_launcher(["--standalone", "--nproc-per-node", "2", "--log-dir", str(tmp_path),
                        "--straggler-interval", "2", "--status", "off", "--skip-check", "all",
                        PLAIN, "--steps", "150", "--hidden", "768", "--batch", "128", "--slow-rank", "1"],
                       timeout=180)
    assert res.returncode == 0, res.stderr
    events = run_events(tmp_path)
    reports = [e for e in events if e["event"] == "straggler"]
    assert len(reports) >= 2, res.stderr
    by_rank = {r: [next(x for x in e["ranks"] if x["rank"] == r) for e in reports] for r in (0, 1)}
    # Three times the compute: about 0.33 on a quiet machine; on a loaded one the shared all-reduce and the
    # scheduler pull it toward 1 (0.66 was seen with twice the compute), so assert the verdict, not the ratio.
    slow = statistics.median(x["relative"] for x in by_rank[1])
    assert slow < 0.7, by_rank[1]
    assert all(x["relative"] == 1.0 for x in by_rank[0])
    assert sum(1 in e["stragglers"] for e in reports) >= len(reports) - 1
    assert all(0 not in e["stragglers"] or e["ranks"][0]["individual"] < 0.7 for e in reports)
    assert "STRAGGLER: rank 1: relative score 0." in res.stderr
    _goodput_ok(events, res.stderr, failures=0)


def test_rounds_that_stepped_restart_without_crash_loop_backoff(tmp_path):
    # Every round makes a few optimizer steps (autobeat heartbeats), then rank 1 dies: short rounds, but not a
    # crash loop, so no back-off even with a large --restart-backoff.
    res = run_launcher(["--standalone", "--nproc-per-node", "2", "--max-restarts", "2", "--restart-backoff", "20",
                        "--log-dir", str(tmp_path), PLAIN, "--steps", "50", "--hidden", "32",
                        "--crash-rank", "1", "--crash-at-step", "5"], timeout=150)
    assert res.returncode == 1, res.stderr[-3000:]
    events = run_events(tmp_path)
    failures = [e for e in events if e["event"] == "failure"]
    assert len(failures) == 3 and all(e["startup"] is False and e["rank"] == 1 for e in failures), failures
    assert [e["backoff"] for e in events if e["event"] == "restart"] == [0.0, 0.0]


def test_torch_save_checkpoints_bound_the_lost_work_in_goodput(tmp_path):
    # rank 0 saves a dict with torch.save every 10 steps; rank 1 dies before step 35 on each attempt. The
    # autobeat hook marks each save, so a failure loses only the steps after the last save (30..35).
    res = run_launcher(["--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--log-dir", str(tmp_path),
                        PLAIN, "--steps", "60", "--hidden", "32", "--crash-rank", "1", "--crash-at-step", "35",
                        "--save-every", "10", "--save", str(tmp_path / "ckpt.pt")], timeout=150)
    assert res.returncode == 1, res.stderr[-3000:]
    events = run_events(tmp_path)
    segments = [e for e in events if e["event"] == "progress"]
    assert len(segments) == 2
    for seg in segments:
        assert seg["checkpoint"] is not None and seg["first_step"] < seg["checkpoint"] <= seg["last_step"], seg
    (good,) = [e for e in events if e["event"] == "goodput"]
    for seg, cost in zip(segments, good["failures"]):
        assert cost["lost"] == pytest.approx(seg["last_step"] - seg["checkpoint"], abs=0.01), (seg, cost)
        assert cost["lost"] < seg["last_step"] - seg["first_step"]
