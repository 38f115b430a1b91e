"""Which entry scripts provably import only the standard library (config.host): real files."""

from __future__ import annotations

import json

import pytest

from mbr_launch.config.host import imports_only_stdlib
from testkit.helpers import run_launcher

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("source, only_stdlib", [
    ("import os, sys\nfrom time import sleep\nimport os.path\n", True),
    ("from __future__ import annotations\nimport argparse\n", True),
    ("import torch\n", False),
    ("def main():\n    import torch.distributed as dist\n", False),  # inside a function counts too
    ("import os\nfrom megatron.core import parallel_state\n", False),  # a package that may import torch
    ("from . import helpers\n", False),
    ("import importlib\nm = importlib.import_module('torch')\n", False),
    ("m = __import__('torch')\n", False),
    ("exec(open('other.py').read())\n", False),
    ("import runpy\n", False),
    ("def broken(:\n", False),
])
def test_imports_are_read_without_running_the_script(tmp_path, source, only_stdlib):
    script = tmp_path / "train.py"
    script.write_text(source)
    assert imports_only_stdlib(str(script)) is only_stdlib


def test_what_cannot_be_read_may_need_torch(tmp_path):
    assert not imports_only_stdlib(str(tmp_path / "absent.py"))
    assert not imports_only_stdlib(str(tmp_path))  # a directory
    assert not imports_only_stdlib(None)


def _start_and_standby(tmp_path, name: str, source: str) -> tuple[dict, set[str]]:
    """One real launch of ``source`` with the default --standby: its start event and, from its standby's
    worker, whether torch was in sys.modules when the script ran."""
    script = tmp_path / f"{name}.py"
    script.write_text(source)
    logs = tmp_path / f"logs-{name}"  # one run's events only
    run = run_launcher(["--nproc-per-node", "1", "--max-restarts", "0", "--status", "off", "--log-dir", str(logs),
                        str(script)], timeout=120)
    assert run.returncode == 0, run.stderr
    events = [json.loads(x) for f in logs.rglob("events.jsonl") for x in f.read_text().splitlines()]
    return next(e for e in events if e["event"] == "start"), set(run.stdout.split())


@pytest.mark.processes
def test_a_launch_of_a_plain_script_preloads_nothing_and_a_torch_script_keeps_the_default(tmp_path):
    probe = "import sys\nprint('torch-loaded' if 'torch' in sys.modules else 'no-torch')\n"
    start, out = _start_and_standby(tmp_path, "plain", probe)
    assert start["standby"]["level"] == "interpreter" and "standard library" in start["standby"]["why"]
    assert "no-torch" in " ".join(out), out
    start, _ = _start_and_standby(tmp_path, "torchy", "import torch\n" + probe)
    assert start["standby"] == {"level": "torch", "why": None}
