"""NVRx's own fault-tolerance examples, unmodified, run under mbr-launch the way NVRx's docs run them under
ft_launcher, each with its own version's client: v0.4.1's (third_party/nvrx-v0.4.1) with the venv's 0.4.1, and
0.7.0's (third_party/nvrx-v0.7.0, from tag v0.7.0-main) with the 0.7.0 wheel's (``.nvrx/0.7.0`` first on
PYTHONPATH: testkit/nvrx_versions.py). How, and why the faults are sent by the test, is in testkit/nvrx_examples.py.

What the 0.7 client does differently and these runs therefore exercise (nvrx-facts.md, "0.6 / 0.7"): it takes
``skip_section_response`` (default True) from the config our monitor returns and then sends heartbeats and
section messages fire-and-forget, reading no reply, so a monitor that still replied filled the socket buffer and
blocked the client after about 135 steps (each epoch here has 160); it sends only the sections named in the YAML;
its InitMsg and SectionMsg carry ``iteration``; its heartbeats YAML leaves the heartbeat timeouts off until the
script calculates them.
"""

from __future__ import annotations

import os
import re
import signal

import pytest

from testkit.nvrx_examples import (HEARTBEATS, SECTIONS, Launch, assert_client, example_args, in_epoch, reap_stopped,
                            run_events, stop_rank, worker_pid)

pytestmark = [pytest.mark.timeout(180), pytest.mark.processes]

VERSIONS = ["0.4.1", "0.7.0"]


@pytest.mark.parametrize("version", VERSIONS)
def test_nvrx_heartbeats_example_recovers_from_a_killed_rank(tmp_path, port, version):
    """train_ddp_heartbeats_api.py: heartbeats, timeouts it calculates at epoch 1's first step and saves with the
    checkpoint. A rank SIGKILLed in epoch 2, where its --simulated_fault rank_killed lands (it is armed once a
    checkpoint holds valid timeouts: resumed from the epoch-0 checkpoint, the script calls
    calculate_and_set_hb_timeouts after one heartbeat and NVRx's client raises "Not enough data to compute
    timeouts", whatever the launcher), restarts the job, which resumes from the epoch-1 checkpoint and
    finishes."""
    run = Launch(example_args(tmp_path, port, version, HEARTBEATS, 3), version=version)
    run.wait_for(in_epoch(2), timeout=120)
    os.kill(worker_pid(tmp_path, rank=1), signal.SIGKILL)
    assert run.finish(timeout=90) == 0, run.text()
    out = run.output()
    assert "Checkpoint was loaded from file" in out and "Leaving main, ret_code=0" in out, run.text()
    assert re.search(r"CHECK VAL SUMMARY: epoch:\s+2 ", out), run.text()
    events = run_events(tmp_path)
    assert_client(events, version)
    failures = [e for e in events if e["event"] == "failure"]
    assert [(f["rank"], f["cause"], f["signal"]) for f in failures] == [(1, "crash", "SIGKILL")], failures
    assert [e["restart_count"] for e in events if e["event"] == "restart"] == [1]
    assert events[-1]["event"] == "end" and events[-1]["exit_code"] == 0


@pytest.mark.parametrize("version", VERSIONS)
def test_nvrx_sections_example_recovers_from_a_stopped_rank(tmp_path, port, version):
    """train_ddp_sections_api.py: init/step/checkpoint sections from its YAML, section timeouts it calculates
    and saves to ft_state.json. A rank SIGSTOPped in epoch 1 (its --simulated_fault rank_hung) is a hang
    caught by those calculated timeouts; the job restarts, loads ft_state.json and the checkpoint, finishes."""
    run = Launch(example_args(tmp_path, port, version, SECTIONS, 2), version=version)
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
    assert_client(events, version)
    hangs = [e for e in events if e["event"] == "hang"]
    assert hangs and all(h["kind"] in ("section", "out_of_section") for h in hangs), hangs
    # calculated from what the script observed (times --ft-safety-factor, so a loaded machine's are larger), not
    # the YAML's own section timeouts
    yaml_timeouts = {"init": 20.0, "step": 10.0, "checkpoint": 30.0}
    assert all(h["timeout"] != yaml_timeouts.get(h["section"]) for h in hangs if h["kind"] == "section"), hangs
    verdicts = [e for e in events if e["event"] == "verdict"]
    assert verdicts and verdicts[0]["culprits"] == [1] and verdicts[0]["basis"] == "stopped", verdicts
    failures = [e for e in events if e["event"] == "failure"]
    assert [(f["rank"], f["cause"]) for f in failures] == [(1, "hang")], failures
    assert [e["restart_count"] for e in events if e["event"] == "restart"] == [1]
    assert events[-1]["event"] == "end" and events[-1]["exit_code"] == 0
