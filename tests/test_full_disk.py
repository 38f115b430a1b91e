"""A full log disk never blocks or kills the job, nor leaves half a line (issue 16, finding 1).

Real launches on a 64 KiB tmpfs as ``--log-dir`` (root mounts it; skipped otherwise): a chatty worker with
``--tee 3``, and a quiet one whose event log runs out of room mid-run. The writers alone, and EIO, are in
test_log_writers.py.
"""

from __future__ import annotations

import pytest

from testkit.eventlog import read_events

from testkit.helpers import run_launcher
from .tinydisk import fill, tiny_disk, whole_lines  # noqa: F401 (tiny_disk: a fixture)

pytestmark = [pytest.mark.timeout(60), pytest.mark.processes]
# ---- real launches on a 64 KiB disk --------------------------------------------------------------------


CHATTY = "import sys\nfor i in range(1500):\n    print(f'out {i}', 'x' * 60, flush=True)\n" \
         "    print(f'err {i}', 'y' * 60, file=sys.stderr, flush=True)\n"


def test_chatty_worker_with_tee_on_a_full_disk_succeeds(tiny_disk, tmp_path):
    script = tmp_path / "chatty.py"
    script.write_text(CHATTY)
    res = run_launcher(["--standalone", "--nproc-per-node", "1", "--tee", "3", "--skip-check", "all",
                        "--log-dir", str(tiny_disk), str(script)], timeout=40)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.count("[rank0]:out ") == 1500 and res.stderr.count("[rank0]:err ") == 1500
    warnings = [line for line in res.stderr.splitlines() if "cannot write worker output" in line]
    assert len(warnings) == 1, warnings
    events = whole_lines(next(tiny_disk.glob("*/events.jsonl")))
    assert events[-1]["event"] == "end" and events[-1]["exit_code"] == 0
    lost = {e["stream"]: e for e in events if e["event"] == "output_lost"}
    assert set(lost) == {"stdout", "stderr"}, lost
    logs = {name: (next(tiny_disk.glob(f"*/attempt_0/0/{name}.log"))).read_bytes() for name in lost}
    for name, event in lost.items():
        assert logs[name].endswith(b"\n") or not logs[name]
        assert event["lost_lines"] + logs[name].count(b"\n") == 1500 and "ENOSPC" in event["error"]
    assert "missing from" in res.stderr  # the summary counts it too


def test_quiet_worker_event_log_runs_out_of_room_mid_run(tiny_disk, tmp_path):
    """One free page: the start event (padded by a long script argument) fits, the events after it cross
    the page and fail with a short write. The job still succeeds, with exit 0 and no half line."""
    fill(tiny_disk, leave_pages=1)
    script = tmp_path / "quiet.py"
    script.write_text("import time\ntime.sleep(0.2)\n")
    res = run_launcher(["--standalone", "--nproc-per-node", "1", "--skip-check", "all", "--log-dir",
                        str(tiny_disk), str(script), "--pad", "p" * 3000], timeout=40)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stderr.count("cannot write the event log") == 1, res.stderr
    assert "internal error" not in res.stderr
    path = next(tiny_disk.glob("*/events.jsonl"))
    events = whole_lines(path)
    assert events[0]["event"] == "start" and events[-1]["event"] != "end", "nothing was lost: test is void"
    assert read_events(path) == events
    assert "event(s) missing from events.jsonl" in res.stderr
