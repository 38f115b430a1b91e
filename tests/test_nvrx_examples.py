"""NVRx v0.4.1's own fault-tolerance examples, unmodified (third_party/nvrx-v0.4.1), run under mbr-launch the
way NVRx's docs run them under ft_launcher, with the venv's NVRx 0.4.1 client; how, and why the faults are sent
by the test, is in tests/nvrx_examples.py (shared with test_nvrx07_examples.py, NVRx 0.7.0's examples).

Each test is its own function, so more examples (the in-job + in-process one) can be added beside them.
"""

from __future__ import annotations

import os
import re
import signal

import pytest

from .nvrx_examples import (HEARTBEATS, SECTIONS, Launch, assert_client, example_args, in_epoch, reap_stopped,
                            run_events, stop_rank, worker_pid)

pytestmark = pytest.mark.timeout(180)

VERSION = "0.4.1"


def test_nvrx_heartbeats_example_recovers_from_a_killed_rank(tmp_path, port):
    """train_ddp_heartbeats_api.py: heartbeats, timeouts it calculates at epoch 1's first step and saves with the
    checkpoint. A rank SIGKILLed in epoch 2, where its --simulated_fault rank_killed lands (it is armed once a
    checkpoint holds valid timeouts: resumed from the epoch-0 checkpoint, the script calls
    calculate_and_set_hb_timeouts after one heartbeat and NVRx's client raises "Not enough data to compute
    timeouts", whatever the launcher), restarts the job, which resumes from the epoch-1 checkpoint and
    finishes."""
    run = Launch(example_args(tmp_path, port, VERSION, HEARTBEATS, 3), version=VERSION)
    run.wait_for(in_epoch(2), timeout=120)
    os.kill(worker_pid(tmp_path, rank=1), signal.SIGKILL)
    assert run.finish(timeout=90) == 0, run.text()
    out = run.output()
    assert "Checkpoint was loaded from file" in out and "Leaving main, ret_code=0" in out, run.text()
    assert re.search(r"CHECK VAL SUMMARY: epoch:\s+2 ", out), run.text()
    events = run_events(tmp_path)
    assert_client(events, VERSION)
    failures = [e for e in events if e["event"] == "failure"]
    assert [(f["rank"], f["cause"], f["signal"]) for f in failures] == [(1, "crash", "SIGKILL")], failures
    assert [e["restart_count"] for e in events if e["event"] == "restart"] == [1]
    assert events[-1]["event"] == "end" and events[-1]["exit_code"] == 0


def test_nvrx_sections_example_recovers_from_a_stopped_rank(tmp_path, port):
    """train_ddp_sections_api.py: init/step/checkpoint sections from its YAML, section timeouts it calculates
    and saves to ft_state.json. A rank SIGSTOPped in epoch 1 (its --simulated_fault rank_hung) is a hang
    caught by those calculated timeouts; the job restarts, loads ft_state.json and the checkpoint, finishes."""
    run = Launch(example_args(tmp_path, port, VERSION, SECTIONS, 2), version=VERSION)
    run.wait_for(in_epoch(1), timeout=120)  # epoch 0 done: step and checkpoint timeouts calculated
    pid = stop_rank(tmp_path, rank=1)
    try:
        assert run.finish(timeout=120) == 0, run.text()
    finally:
        reap_stopped(pid)
    out = run.output()
    assert "FT state loading from" in out and "Checkpoint was loaded from file" in out, run.text()
    assert "Leaving main, ret_code=0" in out, run.text()
    events = run_events(tmp_path)
    assert_client(events, VERSION)
    hangs = [e for e in events if e["event"] == "hang"]
    assert hangs and all(h["kind"] in ("section", "out_of_section") for h in hangs), hangs
    assert all(h["timeout"] < 10 for h in hangs if h["kind"] == "section"), hangs  # calculated, not the YAML's
    verdicts = [e for e in events if e["event"] == "verdict"]
    assert verdicts and verdicts[0]["culprits"] == [1] and verdicts[0]["basis"] == "stopped", verdicts
    failures = [e for e in events if e["event"] == "failure"]
    assert [(f["rank"], f["cause"]) for f in failures] == [(1, "hang")], failures
    assert [e["restart_count"] for e in events if e["event"] == "restart"] == [1]
    assert events[-1]["event"] == "end" and events[-1]["exit_code"] == 0
