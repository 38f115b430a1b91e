"""Every option of the installed NVRx ``ft_launcher`` is accepted by ``mbr-launch`` with the same arity and
meaning, as ``test_flag_parity`` does for torchrun: a script written for ``ft_launcher ... script.py`` runs
unchanged, and no flag's value is ever taken for the training script."""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest
import typer
from nvidia_resiliency_ext.fault_tolerance.launcher import get_args_parser

from mbr_launch.cli.app import app, main
from mbr_launch.config.errors import SettingError
from mbr_launch.config.parse import as_bool
from mbr_launch.config.settings import BY_NAME, SETTINGS, resolve

from .helpers import run_launcher

pytestmark = pytest.mark.timeout(120)

def _ft_actions() -> list[argparse.Action]:
    return [a for a in get_args_parser()._actions
            if a.option_strings and not isinstance(a, argparse._HelpAction)]


FT_FLAGS = [(flag, action) for action in _ft_actions() for flag in action.option_strings]
COMMAND = typer.main.get_command(app)
OURS: dict[str, Any] = {opt: p for p in COMMAND.params for opt in getattr(p, "opts", [])}


def _takes_value(action: argparse.Action) -> bool:
    # store_true and torch's check_env are nargs=0; every other ft_launcher option reads one value
    return action.nargs != 0


def _parse(args: list[str]) -> dict:
    return COMMAND.make_context("mbr-launch", list(args)).params


def test_parser_is_the_one_we_think():
    # A guard against comparing with an empty or different parser (the test would pass vacuously).
    flags = {flag for flag, _ in FT_FLAGS}
    assert {"--ft-cfg-path", "--ft-rank-section-timeouts", "--term-timeout", "--ft-enable-nic-monitor"} <= flags
    assert len(FT_FLAGS) > 80


def test_every_ft_launcher_option_is_accepted():
    missing = sorted(flag for flag, _ in FT_FLAGS if flag not in OURS)
    assert not missing, f"ft_launcher options mbr-launch rejects: {missing}"


ACCEPTED = FT_FLAGS


@pytest.mark.parametrize(("flag", "action"), ACCEPTED, ids=[flag for flag, _ in ACCEPTED])
def test_accepted_with_the_same_arity(flag: str, action: argparse.Action):
    param = OURS[flag]
    if _takes_value(action):
        assert not getattr(param, "is_flag", False), f"{flag} takes a value in ft_launcher, is a switch here"
        sample = action.choices[0] if action.choices else "7"
        params = _parse([flag, str(sample), "train.py"])
        assert params["training_script"] == "train.py" and params[param.name] == str(sample)
        params = _parse([f"{flag}={sample}", "train.py"])
        assert params["training_script"] == "train.py"
    else:
        assert getattr(param, "is_flag", False), f"{flag} is a switch in ft_launcher, takes a value here"
        params = _parse([flag, "train.py"])
        assert params["training_script"] == "train.py" and params[param.name] is True


# ---- meaning -------------------------------------------------------------------------------------


def _ft_value(argv: list[str], dest: str):
    return getattr(get_args_parser().parse_args([*argv, "train.py"]), dest)


@pytest.mark.parametrize("flag", ["--term-timeout", "--term_timeout", "--workers-stop-timeout",
                                  "--workers_stop_timeout"])
def test_stop_timeouts_are_the_stop_grace(flag: str):
    setting = next(s for s in SETTINGS if flag in s.flags)
    assert setting.name == "shutdown_timeout"
    assert resolve({setting.name: "12.5"}, {}, {})["shutdown_timeout"] == 12.5 == _ft_value([flag, "12.5"],
                                                                                             flag[2:].replace("-", "_"))


@pytest.mark.parametrize(("text", "value"), [("true", True), ("True", True), ("1", True), ("yes", True),
                                             ("false", False), ("False", False), ("0", False), ("NO", False)])
def test_nic_monitor_value_means_what_it_means_in_ft_launcher(text: str, value: bool):
    for flag in BY_NAME["enable_nic_monitor"].flags:
        if flag in {f for f, _ in FT_FLAGS}:
            assert _ft_value([flag, text], "ft_enable_nic_monitor") is value
    assert resolve({"enable_nic_monitor": text}, {}, {})["enable_nic_monitor"] is value
    assert resolve({}, {"MBR_ENABLE_NIC_MONITOR": text}, {})["enable_nic_monitor"] is value


@pytest.mark.parametrize("text", ["true", "TRUE", "1", "yes", "on", True])
def test_as_bool_true(text):
    assert as_bool(text) is True


@pytest.mark.parametrize("text", ["false", "FALSE", "0", "no", "off", "", False])
def test_as_bool_false(text):
    assert as_bool(text) is False


@pytest.mark.parametrize("text", ["maybe", "2", "ture", "-1", "truefalse"])
def test_as_bool_rejects(text):
    with pytest.raises(SettingError, match="boolean"):
        as_bool(text)


def test_bad_boolean_value_is_one_clear_error(tmp_path, capsys):
    script = tmp_path / "s.py"
    script.write_text("raise SystemExit('must not run')\n")
    assert main(["--ft-enable-nic-monitor", "maybe", str(script)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--ft-enable-nic-monitor" in err[0] and "'maybe'" in err[0], err
    assert "Traceback" not in "\n".join(err)


def test_options_page_lists_every_ft_launcher_option():
    from .conftest import REPO

    table = (REPO / "docs/options.md").read_text()
    missing = [flag for flag, _ in FT_FLAGS if f"`{flag}`" not in table and f"`{flag} " not in table]
    assert not missing, f"docs/options.md lacks ft_launcher's {missing}: run python -m tools.docgen --write"


# ---- a real launch with ft_launcher's spellings -------------------------------------------------

# The NVRx client takes its config from the rank monitor at init: printing it shows what the flags meant.
CLIENT = """
import json, sys
from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient
client = RankMonitorClient()
client.init_workload_monitoring()
cfg = client.cfg
print("CFG " + json.dumps({"argv": sys.argv[1:], "nic": cfg.enable_nic_monitor, "safety": cfg.safety_factor,
      "initial": cfg.initial_rank_heartbeat_timeout, "hb": cfg.rank_heartbeat_timeout,
      "pci": cfg.pci_topo_file, "link": cfg.link_down_path_template}), flush=True)
client.shutdown_workload_monitoring()
"""


def test_launch_with_ft_launcher_spellings_runs_the_script(tmp_path):
    """ft-only flags in both spellings reach the NVRx client, and ``--ft-enable-nic-monitor true script.py``
    runs script.py (a switch would have run a script named ``true``)."""
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    args = ["--standalone", "--nproc-per-node", "1", "--standby", "off",
            "--ft_param_enable_nic_monitor=False",  # overridden by the last spelling below
            "--ft-param-pci-topo-file", str(tmp_path / "topo.xml"),
            "--ft_param_link_down_path_template", "/sys/class/infiniband/{dev_name}/down",
            "--ft-param-initial_rank_heartbeat_timeout", "77", "--ft-rank_heartbeat_timeout=66",
            "--ft-safety_factor", "3.5", "--term-timeout", "9", "--workers_stop_timeout", "8",
            "--ignore-missing-fault-tol-cfg", "--ft-enable-nic-monitor", "true", str(script),
            "true", "--ft-enable-nic-monitor"]
    res = run_launcher(args, timeout=90)
    assert res.returncode == 0, res.stderr
    line = next(ln for ln in res.stdout.splitlines() if "CFG " in ln)
    cfg = json.loads(line.split("CFG ", 1)[1])
    assert cfg == {"argv": ["true", "--ft-enable-nic-monitor"], "nic": True, "safety": 3.5, "initial": 77.0,
                   "hb": 66.0, "pci": str(tmp_path / "topo.xml"),
                   "link": "/sys/class/infiniband/{dev_name}/down"}, cfg
