"""A clean worker console (issue 15, finding 3), in one real launch with warm standbys (the default level,
``torch``): no deprecation noise from the launcher's own preloading, and a traceback that starts at the
script, printed with one ``[rankN]:`` prefix. Once a process group exists, torch prefixes ``[rankN]:`` of its
own to ``sys.excepthook``'s output (``init_process_group`` wraps the hook) and to its logging handler's
lines (TORCH_LOGS, dynamo's warnings); the agent prefixes every line of the console too.

Rank 1 never imports torch (its standby did, ahead of it); rank 0 makes a one-member gloo group (rank 0 in
it, as in the job), logs through torch's handler and raises from a function of the script."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from testkit.helpers import REPO, launcher_env, run_launcher

pytestmark = [pytest.mark.timeout(120), pytest.mark.processes]

SCRIPT = '''\
import os, sys
print(f"torch preloaded: {'torch' in sys.modules}", flush=True)
if os.environ["RANK"] == "1":
    print("rank 1 never imports torch", flush=True)
    sys.exit(0)
import logging
import torch.distributed as dist

def fail():
    raise RuntimeError("rank 0 fails here")

dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
logging.getLogger("torch._dynamo").warning("a warning through torch's handler")
fail()
'''


def test_traceback_starts_at_the_script_with_one_prefix_and_no_pynvml_noise(tmp_path):
    script = tmp_path / "fails.py"
    script.write_text(SCRIPT)
    env = launcher_env()
    env.pop("PYTHONWARNINGS")  # the helpers silence warnings; this test is about which ones are shown
    res = run_launcher(["--standalone", "--nproc-per-node", "2", "--max-restarts", "0", "--log-dir",
                        str(tmp_path / "logs"), str(script), str(tmp_path / "store")], env=env)
    assert res.returncode == 1, res.stderr
    out = res.stdout + res.stderr
    # The premise: rank 1's standby imported torch before the script ran (not a fresh process).
    assert "[rank1]:torch preloaded: True" in out and "[rank1]:rank 1 never imports torch" in out, out
    assert "pynvml" not in out, out
    assert not [line for line in out.splitlines() if re.match(r"\[rank\d+\]:\s*\[rank\d+\]:", line)], out
    assert re.search(r"^\[rank0\]:W\d{4} .*\] a warning through torch's handler$", res.stderr, re.M), res.stderr
    rank0 = [line[len("[rank0]:"):] for line in res.stderr.splitlines() if line.startswith("[rank0]:")]
    trace = rank0[rank0.index("Traceback (most recent call last):"):]
    assert trace[1] == f'  File "{script}", line 14, in <module>', trace  # the script's own first frame
    assert trace[3] == f'  File "{script}", line 10, in fail', trace
    assert trace[5] == "RuntimeError: rank 0 fails here", trace
    assert not [line for line in trace if "runpy" in line or "mbr_launch" in line], trace


def _boot(script: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mbr_launch.shim.boot", str(script)], capture_output=True,
                          text=True, timeout=30, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})


def test_other_uncaught_exceptions_show_the_scripts_frames_as_python_does(tmp_path):
    """What reaches the interpreter itself (a KeyboardInterrupt; dying of SIGINT, as Python does, is kept) and
    a script that does not compile print exactly as under ``python SCRIPT``: no frame of the shim or runpy."""
    interrupted = tmp_path / "interrupted.py"
    interrupted.write_text("def stop():\n    raise KeyboardInterrupt\n\nstop()\n")
    broken = tmp_path / "broken.py"
    broken.write_text("x = (\n")
    for script, code in ((interrupted, -signal.SIGINT), (broken, 1)):
        res = _boot(script)
        plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=30)
        assert res.returncode == plain.returncode == code, res.stderr
        assert res.stderr == plain.stderr and "runpy" not in res.stderr, res.stderr
