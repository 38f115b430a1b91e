"""ft_launcher 0.6/0.7's cycle features in one real launch: progress tracking across restarts (a cycle with
progress resets the count; the limit ends the job with 93 and the line that says why), cycle-info files with
NVRX_CURRENT_CYCLE_INFO, per-cycle application logs. A standard-library script, so the launch is short; the
rules themselves are tested without processes (test_noprogress.py, test_cycles_replay.py, test_cycleinfo.py,
test_cyclelog.py)."""

from __future__ import annotations

import json
import os

import pytest

from testkit.eventlog import read_events

from testkit.helpers import SCRIPTS, run_launcher

SCRIPT = str(SCRIPTS / "no_progress.py")
pytestmark = [pytest.mark.timeout(120), pytest.mark.processes]


def test_progress_resets_the_count_and_the_limit_stops_the_job_with_93(tmp_path):
    """Cycle 0 makes no progress, cycle 1 advances the checkpoint (the count starts over), cycles 2 and 3 make
    none: the second in a row reaches --ft-max-no-progress-cycles 2, and the job ends instead of a cycle 4.
    Without the reset it would have ended after cycle 1."""
    ckpt = tmp_path / "latest_checkpointed_iteration.txt"
    ckpt.write_text("100\n")
    info, logs, runs = tmp_path / "nvrx", tmp_path / "applogs", tmp_path / "runs"
    res = run_launcher(["--standalone", "--skip-check", "all", "--standby", "off", "--restart-backoff", "0",
                        "--nproc-per-node", "2", "--max-restarts", "9", "--log-dir", str(runs),
                        "--ft-max-no-progress-cycles", "2", "--ft-checkpoint-iteration-file", str(ckpt),
                        "--ft-cycle-info-dir", str(info), "--ft-cycle-info-job-id", "job7",
                        "--ft-per-cycle-applog-prefix", str(logs / "train.log"),
                        SCRIPT, "--iter-file", str(ckpt), "--advance-in", "1"])
    assert res.returncode == 93, res.stderr[-3000:]
    line = ("no progress in 2 cycles in a row (cycle 2: checkpoint iteration 110 -> 110; cycle 3: checkpoint "
            "iteration 110 -> 110; an advance of at least 1 needed): not restarting (--ft-max-no-progress-cycles 2)")
    assert f"done: {line} (exit code 93)" in res.stderr, res.stderr[-3000:]
    assert "cycle 0: checkpoint iteration 100 -> 100: no progress, 1 of 2 cycles in a row" in res.stderr
    (path,) = runs.glob("*/events.jsonl")
    events = read_events(path)
    assert [e["event"] for e in events].count("rendezvous") == 4  # cycles 0-3, no cycle 4
    assert [(e["cycle"], e["start"], e["end"], e["progress"], e["no_progress_cycles"], e["stop"])
            for e in events if e["event"] == "cycle_progress"] == [
        (0, 100, 100, False, 1, False), (1, 100, 110, True, 0, False), (2, 110, 110, False, 1, False),
        (3, 110, 110, False, 2, True)]
    assert events[-1]["event"] == "end" and (events[-1]["exit_code"], events[-1]["reason"]) == (93, line)
    # cycle-info files, written by the store's host (the only agent here); the link names the last cycle
    current = info / "cycle_info.job7.current"
    assert os.readlink(current) == "cycle_info.job7.0.3"
    for cycle in range(4):
        record = json.loads((info / f"cycle_info.job7.0.{cycle}").read_text())
        assert (record["job_id"], record["attempt_index"], record["cycle_number"], record["active_ranks"],
                record["generation"]) == ("job7", 0, cycle, "0", "1")
        assert record["cycle_start_time"] < record["cycle_end_time"] and record["active_nodes"]  # torch's view
        assert record["cycle_log_file"] == str(logs / f"train_cycle{cycle}.log")
        # every rank's stdout and stderr, as NVRx writes them
        applog = (logs / f"train_cycle{cycle}.log").read_text().splitlines()
        assert sorted(applog) == sorted([f"{r}: rank {r} cycle {cycle} starts" for r in (0, 1)] +
                                        [f"{r}: rank {r} cycle info {current}" for r in (0, 1)]), applog
    assert not (logs / "train_cycle4.log").exists() and not (info / "cycle_info.job7.0.4").exists()
    assert "rank 1 cycle 3 starts" in res.stdout  # the launcher's own output goes on as before
