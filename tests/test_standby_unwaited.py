"""A standby assigned while it still preloads runs the script at once; the script waits for the preload only
where it needs it: at its first `import torch`, before a fork, and at exit. Real standby processes started by
the agent's StandbyPool, with a preload module that takes 4 s to import after torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mbr_launch.workers.process import WorkerSpec
from mbr_launch.workers.standbypool import StandbyPool

from testkit.helpers import launcher_env

pytestmark = [pytest.mark.timeout(120), pytest.mark.processes]

SLOW = "import time\ntime.sleep(4)\n"
SCRIPT = '''\
import json, os, sys, threading, time
first = {"preloading": any(t.name == "standby-preload" for t in threading.enumerate()),
         "slow": "slow_mbr_preload" in sys.modules}
if sys.argv[2] == "torch":
    import torch  # waits for the rest of the preload
    first["after"] = "slow_mbr_preload" in sys.modules
else:
    pid = os.fork()  # waits for the preload: the child must not inherit its import locks
    if pid == 0:
        os._exit(0 if "slow_mbr_preload" in sys.modules else 3)
    _, status = os.waitpid(pid, 0)
    first["after"] = os.waitstatus_to_exitcode(status) == 0
with open(sys.argv[1], "w") as f:
    json.dump(first, f)
'''


def _run(tmp_path: Path, mode: str) -> dict:
    script, out = tmp_path / "script.py", tmp_path / f"{mode}.json"
    script.write_text(SCRIPT)
    (tmp_path / "slow_mbr_preload.py").write_text(SLOW)
    argv = [sys.executable, "-m", "mbr_launch.shim.boot", str(script), str(out), mode]
    env = {**launcher_env(), "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]), str(tmp_path)]),
           "LOCAL_RANK": "0"}
    pool = StandbyPool(level="torch", prepare=lambda _lr: (argv, env), cwd=str(tmp_path), preload=["slow_mbr_preload"])
    pool.fill([0], delay=0.0)
    worker = None
    try:
        # Assigned while torch (and then the 4 s module) is still being imported.
        worker = pool.take(WorkerSpec(local_rank=0, rank=0, argv=argv, env={**env, "RANK": "0"},
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
        assert worker is not None, pool.last_miss
        worker.proc.wait(60)
        stderr = worker.proc.stderr.read().decode()  # type: ignore[union-attr]
        assert worker.proc.returncode == 0, stderr
        return json.loads(out.read_text())
    finally:
        if worker is not None and worker.proc.poll() is None:
            worker.proc.kill()
            worker.proc.wait(10)
        pool.close()


@pytest.mark.parametrize("mode", ["torch", "plain"])
def test_the_script_starts_before_a_preload_it_waits_for_only_at_import_torch_and_fork(tmp_path, mode):
    record = _run(tmp_path, mode)
    if not record["preloading"] and not record["slow"]:
        pytest.skip("the standby held its preload back (host load above its saturation limit)")
    assert record["preloading"] and not record["slow"], record  # started while the preload went on
    assert record["after"], record  # `import torch` (or the fork) waited for the preload to end
