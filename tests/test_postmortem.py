"""The post-mortem a timed-out launcher test prints (testkit/postmortem.py): it must name what was running."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from testkit.postmortem import describe_session


@pytest.mark.processes
@pytest.mark.timeout(60)
def test_a_timed_out_session_is_described_with_its_processes_stacks_and_events(tmp_path):
    run = tmp_path / "run1"
    run.mkdir()
    (run / "events.jsonl").write_text(json.dumps({"event": "worker_start", "rank": 0}) + "\n")
    code = "import time\ndef waiting_here():\n    time.sleep(60)\nprint('up', flush=True)\nwaiting_here()\n"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        assert proc.stdout.readline() == "up\n"
        time.sleep(0.2)  # inside the sleep
        text = describe_session(proc.pid, ["--log-dir", str(tmp_path)])
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert f"pid {proc.pid} " in text and " S wchan=" in text, text
    assert "thread " in text
    assert "waiting_here" in text, text  # its Python stack (py-spy is a test dependency)
    assert '"event": "worker_start"' in text
