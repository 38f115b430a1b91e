"""The launcher starts with the cyclic collector paused (``mbr_launch.gcpause``) and collects again, with the
start-up's objects frozen, before its agent runs or any other command does its work."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import textwrap

import pytest

from mbr_launch import gcpause
from testkit.helpers import REPO, launcher_env, free_port

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def collector():
    """Restore this process's collector whatever a test did to it."""
    was = gc.isenabled()
    yield
    gcpause._paused = False
    gc.unfreeze()
    (gc.enable if was else gc.disable)()


def test_pause_then_resume_freezes_what_was_made_meanwhile(collector):
    gc.enable()
    gcpause.pause_gc()
    assert not gc.isenabled()
    kept = [[] for _ in range(1000)]
    gcpause.resume_gc()
    assert gc.isenabled() and gc.get_freeze_count() >= len(kept)
    frozen = gc.get_freeze_count()
    gcpause.resume_gc()  # a second end of the start-up changes nothing
    assert gc.get_freeze_count() == frozen


def test_a_collector_someone_else_disabled_stays_disabled(collector):
    gc.disable()
    gcpause.pause_gc()
    gcpause.resume_gc()  # the Python API in someone's process: their choice stands
    assert not gc.isenabled() and gc.get_freeze_count() == 0


def _launch_probe(run_body: str, argv: list[str], setup: str = "") -> dict:
    """Run the real console entry in a fresh interpreter with the agent's loop replaced by ``run_body`` (the
    body of ``run(self)``, which prints one JSON line). The replacement is installed when the preflight
    starts, after the early processes are spawned and before torch is imported, so the probe changes
    nothing that happens before."""
    probe = (
        "from mbr_launch.gcpause import pause_gc; pause_gc()\n"  # as entry() would, before any import of ours
        "import gc, json, sys\n"
        "from mbr_launch import api\n"
        f"{textwrap.dedent(setup)}\n"
        "def run(self):\n"
        f"{textwrap.indent(textwrap.dedent(run_body), '    ')}\n"
        "preflight = api.preflight\n"
        "def then_patch(*args, **kwargs):\n"
        "    from mbr_launch.agent import lifecycle\n"
        "    lifecycle.Agent.run = run\n"
        "    return preflight(*args, **kwargs)\n"
        "api.preflight = then_patch\n"
        f"sys.argv = ['mbr-launch', *{argv!r}]\n"
        "from mbr_launch.cli.entry import entry\n"
        "entry()\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=90, cwd=REPO,
                          env=launcher_env(PET_MASTER_PORT=str(free_port())))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _agent_sees(argv: list[str]) -> dict:
    """The collector's state and what is imported when the agent would start running."""
    return _launch_probe("""
        print(json.dumps({"enabled": gc.isenabled(), "frozen": gc.get_freeze_count(),
                          "torch": "torch" in sys.modules, "typer": "typer" in sys.modules,
                          "rich": "rich" in sys.modules, "yaml": "yaml" in sys.modules,
                          "psutil": "psutil" in sys.modules,
                          "bridge": "mbr_launch.doctor.mbridge" in sys.modules}), flush=True)
        return 0
    """, argv)


@pytest.mark.processes
def test_the_agent_runs_with_the_collector_on_and_the_imports_frozen(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("pass\n")
    seen = _agent_sees(["--standby", "off", "--nproc-per-node", "1", str(script)])
    # frozen: the start-up's objects (torch's elastic stack) are out of every later collection
    assert seen["enabled"] and seen["torch"] and seen["frozen"] > 100_000, seen
    assert not seen["typer"], seen  # a plain line: read without typer (cli.plainline)
    # Each costs every agent CPU before its ranks start: a preflight warning line is plain text (no rich),
    # the host scans read /proc (no psutil), and no --config means no Megatron-Bridge config model.
    assert not (seen["rich"] or seen["psutil"] or seen["bridge"]), seen
    quiet = _agent_sees(["--standby", "off", "--quiet", "--nproc-per-node", "1", str(script)])
    assert not (quiet["typer"] or quiet["rich"] or quiet["yaml"]), quiet  # nothing to print, no config file
    seen = _agent_sees(["--standby", "off", "--nproc-per-node", "1", "--nproc-per-node", "1", str(script)])
    assert seen["enabled"] and seen["typer"], seen  # repeated: typer's, and the collector still comes back


# python -c probes of when the collector runs, and what is imported by then
PAUSED_FROM_THE_FIRST_IMPORT = (
    "import gc, sys; import mbr_launch.cli.entry as e, mbr_launch.cli.plainline as q; "
    "q.run = lambda argv: print(gc.isenabled(), 'typer' in sys.modules, 'torch' in sys.modules, flush=True) or 0; "
    "e.entry()")
# the launch stays paused until its imports are done (api.launch: the agent test above); other commands collect
OTHER_COMMANDS_COLLECT = (
    "import gc; from mbr_launch.gcpause import pause_gc; pause_gc(); from mbr_launch.cli import app; "
    "app._run_app = lambda cli, argv, prog, **kw: print(prog, gc.isenabled()) or 0; "
    "app.main(['s.py']); app.main(['doctor']); app.main(['report'])")


@pytest.mark.parametrize("code, expected", [
    (PAUSED_FROM_THE_FIRST_IMPORT, ["False False False"]),
    (OTHER_COMMANDS_COLLECT, ["mbr-launch False", "mbr-launch doctor True", "mbr-launch report True"]),
], ids=["console-script-paused-first", "other-commands-collect"])
@pytest.mark.processes
def test_when_the_collector_runs(code: str, expected: list[str]) -> None:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.stdout.splitlines() == expected, done


@pytest.mark.processes
def test_the_rank_monitor_starts_before_the_launcher_imports_torch(tmp_path):
    """Its start-up overlaps the launcher's: the agent does not wait for it before joining (many agents on
    few cores give each process only its share of the CPUs). It is forked from the launcher, not a new
    interpreter (monitor.link), and the agent adopts that process."""
    script = tmp_path / "s.py"
    script.write_text("pass\n")
    seen = _launch_probe("""
        early = self._early_monitor
        print(json.dumps({"torch_at_spawn": spawned, "adopted": early is not None and early.pid is not None,
                          "alive": early is not None and early.exit_code() is None,
                          "forked": type(early._proc).__name__}), flush=True)
        early.close()
        return 0
    """, ["--standby", "off", "--nproc-per-node", "1", str(script)], setup="""
        from mbr_launch.monitor import link
        spawned = []
        spawn = link.MonitorLink.spawn
        def recorded(self, **kw):
            spawned.append(["torch" in sys.modules, kw])
            return spawn(self, **kw)
        link.MonitorLink.spawn = recorded
    """)
    # spawned once, before torch, forked (the launcher had one thread); the agent received that very process,
    # still running (waiting for its config)
    assert seen == {"torch_at_spawn": [[False, {"fork": True}]], "adopted": True, "alive": True,
                    "forked": "Forked"}, seen
