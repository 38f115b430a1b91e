"""The NVRx versions whose real clients the tests run: 0.4.1 (installed in the venv, what pip gives on this
glibc) and 0.6.0 / 0.7.0 (``scripts/setup`` puts each in ``.nvrx/VERSION``; a process imports it through
PYTHONPATH, ahead of the venv's 0.4.1)."""

from __future__ import annotations

import os
from pathlib import Path

from .helpers import REPO

INSTALLED = "0.4.1"
NEW = ("0.6.0", "0.7.0")
ALL = (INSTALLED, *NEW)


def nvrx_dir(version: str) -> Path:
    """Where ``scripts/setup`` installed ``version``; a missing one is a setup error, never a skip."""
    path = REPO / ".nvrx" / version
    if not (path / "nvidia_resiliency_ext" / "fault_tolerance" / "__init__.py").is_file():
        raise RuntimeError(f"NVRx {version} is not in {path}: run scripts/setup")
    return path


def nvrx_env(version: str, env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) with ``version``'s NVRx first on PYTHONPATH; 0.4.1 is the venv's own."""
    out = dict(os.environ if env is None else env)
    if version == INSTALLED:
        return out
    path = str(nvrx_dir(version))
    out["PYTHONPATH"] = os.pathsep.join(p for p in (path, out.get("PYTHONPATH", "")) if p)
    return out
