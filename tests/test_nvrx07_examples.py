"""NVRx 0.7.0's own fault-tolerance examples, unmodified (third_party/nvrx-v0.7.0, from tag v0.7.0-main), run
under mbr-launch with the 0.7.0 wheel's client (``.nvrx/0.7.0`` first on PYTHONPATH: tests/nvrx_versions.py) the
way NVRx's docs run them under ft_launcher; how, and why the faults are sent by the test, is in
tests/nvrx_examples.py (shared with test_nvrx_examples.py, NVRx 0.4.1's examples).

What the 0.7 client does differently from 0.4.1 and what these tests therefore exercise (nvrx-facts.md,
"0.6 / 0.7"): it takes ``skip_section_response`` (default True) from the config our monitor returns and then
sends heartbeats and section messages fire-and-forget, reading no reply, so a monitor that still replies fills
the socket buffer and blocks the client after about 135 steps (each epoch here has 160); it sends only the
sections named in the YAML; its InitMsg and SectionMsg carry ``iteration``; it installs an excepthook that
``os._exit``s.
"""

from __future__ import annotations

import os
import re
import signal

import pytest

from .nvrx_examples import (HEARTBEATS, SECTIONS, Launch, assert_client, example_args, in_epoch, reap_stopped,
                            run_events, stop_rank, worker_pid)

pytestmark = pytest.mark.timeout(180)

VERSION = "0.7.0"


def test_nvrx07_heartbeats_example_recovers_from_a_killed_rank(tmp_path, port):
    """train_ddp_heartbeats_api.py with its YAML (heartbeat timeouts null: off until the script calculates them
    at epoch 1's second step and saves them with the checkpoint). A rank SIGKILLed in epoch 2, where its
    --simulated_fault rank_killed lands (armed only once a checkpoint holds valid timeouts), restarts the job,
    which resumes from the epoch-1 checkpoint, heartbeat timeouts included, and finishes."""
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


def test_nvrx07_sections_example_recovers_from_a_stopped_rank(tmp_path, port):
    """train_ddp_sections_api.py with its YAML (init/step/checkpoint sections), section timeouts it calculates
    and saves to ft_state.json. A rank SIGSTOPped in epoch 1 (its --simulated_fault rank_hung) is a hang caught
    by those calculated timeouts; the verdict names the stopped rank; the job restarts, loads ft_state.json and
    the checkpoint, and finishes."""
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
