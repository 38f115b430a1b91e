"""What runs inside workers imports nothing of the agent: ``mbr_launch.shim`` takes only ``mbr_launch.contract``,
``mbr_launch.fdwait``, ``mbr_launch.procstat`` and ``mbr_launch.forking`` (and the standard library; torch only late, where a
standby preloads it), and those only the standard library. Checked on the source (every import statement, function-local ones included) and in a real
interpreter (what ``import mbr_launch.shim.boot`` actually loads)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import mbr_launch

PACKAGE = Path(mbr_launch.__file__).parent
SHIM_FILES = sorted((PACKAGE / "shim").rglob("*.py"))


def imported_modules(path: Path) -> list[str]:
    """Every module an import statement in ``path`` names, anywhere in the file."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import (the shim uses absolute imports)"
            names.append(node.module or "")
    return names


# stdlib-only modules the agent and the shim both use
SHARED = ("mbr_launch.contract", "mbr_launch.fdwait", "mbr_launch.procstat", "mbr_launch.forking")


def test_shim_imports_only_contract_and_shim():
    assert len(SHIM_FILES) >= 5  # __init__, boot, standby, autobeat, flight
    wrong = [(str(p.relative_to(PACKAGE)), name) for p in SHIM_FILES for name in imported_modules(p)
             if name.split(".")[0] == "mbr_launch"
             and not (name in SHARED or name == "mbr_launch.shim" or name.startswith("mbr_launch.shim."))]
    assert not wrong, f"shim modules import agent code: {wrong}"


def test_shim_imports_no_third_party_module_but_torch():
    allowed = set(sys.stdlib_module_names) | {"mbr_launch", "torch", "__future__"}
    wrong = [(str(p.relative_to(PACKAGE)), name) for p in SHIM_FILES for name in imported_modules(p)
             if name.split(".")[0] not in allowed]
    assert not wrong, wrong


def test_contract_and_fdwait_import_only_the_standard_library():
    for shared in ("contract.py", "fdwait.py", "procstat.py", "forking.py"):
        names = imported_modules(PACKAGE / shared)
        assert all(n.split(".")[0] in sys.stdlib_module_names or n == "__future__" for n in names), (shared, names)


def test_workers_start_through_the_boot_module_the_contract_names():
    import importlib

    from mbr_launch.contract import BOOT_MODULE
    from mbr_launch.shim import boot

    assert importlib.import_module(BOOT_MODULE) is boot and hasattr(boot, "main")


@pytest.mark.processes
def test_importing_the_shim_loads_nothing_of_the_agent_nor_torch():
    code = ("import sys, json; import mbr_launch.shim.boot, mbr_launch.shim.standby, mbr_launch.shim.autobeat, "
            "mbr_launch.shim.flight; "
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('mbr_launch', 'torch'))))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PACKAGE.parent), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60, check=True)
    loaded = json.loads(out.stdout)
    assert set(loaded) == {"mbr_launch", "mbr_launch.contract", "mbr_launch.fdwait", "mbr_launch.shim",
                           "mbr_launch.shim.boot", "mbr_launch.shim.standby", "mbr_launch.shim.envwatch",
                           "mbr_launch.shim.autobeat", "mbr_launch.shim.flight"}, loaded


STUCK_AFTER_FAILURE = """
import sys, threading, time

stop = threading.Event()
threading.Thread(target=stop.wait, name="ProgressWatchdog-4").start()  # non-daemon, never set: as NVRx's
if sys.argv[1] == "raise":
    raise RuntimeError("teardown failed")
if sys.argv[1] == "exit3":
    sys.exit(3)
stop.set()  # "ok": the thread ends, the script succeeds
"""


def _boot(tmp_path: Path, mode: str) -> subprocess.CompletedProcess:
    script = tmp_path / "stuck.py"
    script.write_text(STUCK_AFTER_FAILURE)
    code = ("import sys; import mbr_launch.shim.boot as boot; boot.EXIT_GRACE = 0.5; "
            f"sys.argv = ['boot', {str(script)!r}, {mode!r}]; boot.main()")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(PACKAGE.parent)})


@pytest.mark.processes
def test_a_failed_script_exits_although_a_non_daemon_thread_never_ends(tmp_path):
    """python would wait for the thread forever: the rank would neither run nor exit."""
    res = _boot(tmp_path, "raise")
    assert res.returncode == 1, res.stderr
    assert "RuntimeError: teardown failed" in res.stderr
    assert "1 non-daemon thread(s) still run 0.5 s later (ProgressWatchdog-4): exiting without them" in res.stderr
    assert _boot(tmp_path, "exit3").returncode == 3
    ok = _boot(tmp_path, "ok")  # success keeps Python's rules (the thread ended by itself here)
    assert ok.returncode == 0 and "non-daemon" not in ok.stderr, ok.stderr
