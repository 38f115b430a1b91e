"""Which entry scripts provably import only the standard library (config.scriptscan): real files."""

from __future__ import annotations

import pytest

from mbr_launch.config.scriptscan import imports_only_stdlib

pytestmark = pytest.mark.timeout(30)


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
    assert not imports_only_stdlib("json", module=True)
    assert not imports_only_stdlib(None)
