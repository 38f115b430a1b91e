"""``cluster.round`` is torch-free at import: the modules that only pass a round along (the workers' environment,
which the early standby pool builds before the launcher imports torch) can name ``Round`` without loading it."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = [pytest.mark.processes, pytest.mark.timeout(60)]


@pytest.mark.parametrize("module", ["mbr_launch.cluster.round", "mbr_launch.workers.env"])
def test_importing_it_leaves_torch_out(module):
    code = f"import sys, {module}; print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50, check=True)
    assert out.stdout.strip() == "[]", out.stdout
