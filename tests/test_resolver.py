"""The agent's resolver retries a lost DNS packet after 1 s (``cluster.resolver``); the user's own
``RES_OPTIONS`` wins, and the workers get the user's environment, not the agent's setting."""

from __future__ import annotations

import os

import pytest

from mbr_launch.cli import app, process
from mbr_launch.cluster import resolver
from testkit.helpers import launcher_env, run_launcher

pytestmark = pytest.mark.timeout(120)


def test_quick_retries_unless_the_user_chose():
    mine: dict[str, str] = {}
    resolver.quick_retries(mine)
    assert mine == {"RES_OPTIONS": "timeout:1 attempts:5"}
    theirs = {"RES_OPTIONS": "ndots:2"}
    resolver.quick_retries(theirs)
    assert theirs == {"RES_OPTIONS": "ndots:2"}


def test_the_launcher_sets_it_for_itself(monkeypatch):
    monkeypatch.delenv("RES_OPTIONS", raising=False)  # conftest restores the process's environment after
    monkeypatch.setattr(app, "_run_app", lambda *a, **kw: 0)
    assert app.main(["s.py"]) == 0
    assert os.environ["RES_OPTIONS"] == resolver.AGENT_RES_OPTIONS
    assert "RES_OPTIONS" not in process.USER_ENV  # what the workers get


@pytest.mark.processes
def test_workers_get_the_users_environment(tmp_path):
    script = tmp_path / "env.py"
    script.write_text("import os\nprint('RES_OPTIONS=' + repr(os.environ.get('RES_OPTIONS')))\n")
    plain = launcher_env()
    plain.pop("RES_OPTIONS", None)
    run = run_launcher(["--standby", "off", "--nproc-per-node", "1", str(script)], env=plain, timeout=90)
    assert run.returncode == 0, run.stderr
    assert "RES_OPTIONS=None" in run.stdout, run.stdout
    run = run_launcher(["--standby", "off", "--nproc-per-node", "1", str(script)],
                       env=launcher_env(RES_OPTIONS="ndots:3"), timeout=90)
    assert run.returncode == 0, run.stderr
    assert "RES_OPTIONS='ndots:3'" in run.stdout, run.stdout
