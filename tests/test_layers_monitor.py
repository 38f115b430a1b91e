"""The rank monitor's process loads only its own modules, ``mbr_launch.contract`` and ``mbr_launch.procstat``, and
the standard library: never the agent, torch or rich. It runs as ``python -S -m mbr_launch.monitor.server`` (where
the launcher cannot fork it), without the environment's site-packages, so a third-party import there would end
the monitor at start, and anything more of the package is CPU that 32 agents starting on 2 cores pay 32 times.
tests/test_layers.py checks the same rule on the source (``PROCESSES`` in tools/layers.py); this is the real
interpreter, which also sees what an import made at run time would load."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import mbr_launch
from mbr_launch.monitor.wire import SERVER_MODULE

PACKAGE_ROOT = os.path.dirname(os.path.dirname(mbr_launch.__file__))

# What ``import mbr_launch.monitor.server`` loaded in a fresh interpreter (2026-12-03): the monitor's own modules
# but link (the agent's side), and the two standard-library-only leaves.
EXPECTED = {"mbr_launch", "mbr_launch.contract", "mbr_launch.procstat", "mbr_launch.monitor",
            *(f"mbr_launch.monitor.{m}" for m in ("ancestry", "connections", "control", "deadlines",
                                                  "protocol", "replies", "server", "sockets", "state", "steps",
                                                  "wire", "witness")),
            "mbr_launch.unpickle", *(f"mbr_launch.unpickle.{m}" for m in ("machine", "objects", "policy"))}

# Without -S, so that torch, rich or anything else of the environment would load (and be named) if the monitor
# imported it; only what the import adds counts (site's .pth files may import modules of their own first).
PROBE = ("import sys, json; before = set(sys.modules); import {module}; "
         "print(json.dumps(sorted(set(sys.modules) - before)))")


def _loaded_by(module: str) -> list[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (PACKAGE_ROOT, os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run([sys.executable, "-c", PROBE.format(module=module)], capture_output=True, text=True,
                          env=env, timeout=60, check=True)
    return json.loads(done.stdout)


@pytest.mark.processes
def test_the_monitor_process_loads_nothing_of_the_agent_nor_a_third_party_module():
    assert SERVER_MODULE == "mbr_launch.monitor.server"  # the module the link starts
    loaded = _loaded_by(SERVER_MODULE)
    ours = {m for m in loaded if m.split(".")[0] == "mbr_launch"}
    foreign = sorted(m for m in loaded if m.split(".")[0] not in sys.stdlib_module_names | {"mbr_launch"})
    assert not foreign, f"the rank monitor's process loads {foreign}"
    assert ours == EXPECTED, (sorted(ours - EXPECTED), sorted(EXPECTED - ours))


@pytest.mark.processes
def test_the_probe_sees_the_agent_and_third_party_modules():
    # Guards the test above: the same probe on the agent's side names what the monitor must not load.
    loaded = _loaded_by("mbr_launch.agent.lifecycle")
    assert "mbr_launch.agent.loop" in loaded and "torch" in {m.split(".")[0] for m in loaded}
