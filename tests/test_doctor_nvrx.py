"""The doctor on NVRx versions: which NVRx the workers import (and from where), whose defaults mbr-launch follows,
and ft_launcher's options that version's ft_launcher refuses or its clients ignore. Pure checks with the NVRx
probe injected, then the command line once with a real PYTHONPATH."""

from __future__ import annotations

import json

import pytest

from mbr_launch.cli.app import main
from mbr_launch.config.nvrx import NvrxFound
from mbr_launch.doctor import DoctorContext, run_checks, to_json
from mbr_launch.doctor.probes import Versions

from testkit.nvrx_versions import nvrx_dir

pytestmark = pytest.mark.timeout(60)


def result(check_id: str, nvrx: str | None = "0.7.0", **kw) -> dict:
    kw.setdefault("versions", lambda: Versions("2.7.1", "2.27.3", "0.4.1", "12.8"))
    kw.setdefault("other_launchers", lambda: [])
    c = DoctorContext.from_values(env={}, find_nvrx=lambda env: NvrxFound(nvrx, f"/site/nvrx-{nvrx}.dist-info",
                                                                           "PYTHONPATH"), **kw)
    [found] = [r for r in json.loads(to_json(run_checks(c)))["checks"] if r["id"] == check_id]
    return found


@pytest.mark.parametrize(("nvrx", "severity", "says"), [
    ("0.7.0", "ok", ["nvidia-resiliency-ext 0.7.0", "on PYTHONPATH", "ft_launcher 0.7's defaults",
                     "rank_heartbeat_timeout none", "max_no_progress_cycles 3", "gpu_memory_reclaim_timeout 50"]),
    ("0.6.0", "ok", ["ft_launcher 0.6's defaults", "max_no_progress_cycles 2", "enable_nic_healthcheck true"]),
    ("0.4.1", "ok", ["ft_launcher 0.4.1's defaults", "initial_rank_heartbeat_timeout 3600",
                     "rank_heartbeat_timeout 2700", "max_no_progress_cycles 0"]),
    ("0.9.1", "ok", ["ft_launcher 0.7's defaults (the newest line it knows)"]),
    ("0.3.0", "warn", ["older than tested"]),
    (None, "warn", ["not installed in the workers' environment"]),
])
def test_the_workers_nvrx_and_the_defaults_it_brings(nvrx, severity, says):
    found = result("versions.nvrx", nvrx)
    assert found["severity"] == severity and all(s in found["saw"] for s in says), found


@pytest.mark.parametrize(("nvrx", "given", "flags", "severity", "says"), [
    ("0.7.0", {}, (), "skip", ["no ft_launcher options given"]),
    ("0.7.0", {"safety_factor": "3"}, ("--ft-param-safety_factor",), "info",
     ["--ft-param-safety_factor: ft_launcher 0.6+ refuses it", "as --ft-safety-factor"]),
    ("0.4.1", {"safety_factor": "3"}, ("--ft-param-safety_factor",), "ok", ["means the same to NVRx 0.4.1"]),
    ("0.6.0", {"restart_policy": "min-healthy"}, ("--ft-restart-policy",), "info",
     ["--ft-restart-policy min-healthy: ft_launcher 0.6+ refuses it; mbr-launch keeps it"]),
    ("0.6.0", {"rdzv_impl": "legacy"}, (), "ok", []),
    ("0.7.0", {"rdzv_impl": "legacy"}, (), "info", ["ft_launcher 0.7+ refuses it"]),
    ("0.7.0", {"ignore_missing_ft_config": True}, ("--ignore-missing-fault-tol-cfg",), "info", ["0.6+ refuses it"]),
    ("0.4.1", {"skip_section_response": "false", "num_warmup_iterations": "3"}, (), "warn",
     ["--ft-skip-section-response: NVRx 0.4.1 clients ignore it", "--ft-num-warmup-iterations"]),
    ("0.7.0", {"skip_section_response": "false"}, (), "ok", []),
    ("0.4.1", {"enable_nic_monitor": "maybe"}, (), "warn", ["'maybe' is read as false"]),
    ("0.7.0", {"enable_nic_monitor": "maybe"}, (), "warn", ["'maybe' is read as true"]),
    (None, {"skip_section_response": "false"}, (), "skip", ["no nvidia-resiliency-ext"]),
])
def test_options_against_the_workers_nvrx(nvrx, given, flags, severity, says):
    found = result("launcher.ft_options", nvrx, ft_given=given, flags=flags)
    assert found["severity"] == severity and all(s in found["saw"] for s in says), found
    if severity == "warn":
        assert found["fix"]


def test_the_command_line_reports_the_workers_nvrx_and_the_spellings(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("PYTHONPATH", str(nvrx_dir("0.7.0")))
    code = main(["doctor", "--json", "--skip-check", "versions.torch,versions.nccl", "--standalone",
                 "--ft-param-safety_factor", "3", "--ft-restart-policy=min-healthy", "--ft-log-level", "debug",
                 "--ft-rank-heartbeat-timeout", "null", str(tmp_path / "train.py")])
    report = {r["id"]: r for r in json.loads(capsys.readouterr().out)["checks"]}
    assert code in (0, 1, 2)
    nvrx, options = report["versions.nvrx"], report["launcher.ft_options"]
    assert "nvidia-resiliency-ext 0.7.0" in nvrx["saw"] and "on PYTHONPATH" in nvrx["saw"], nvrx
    assert options["severity"] == "info", options
    assert "--ft-param-safety_factor: ft_launcher 0.6+ refuses it" in options["saw"]
    assert "--ft-restart-policy min-healthy" in options["saw"]


def test_a_training_config_that_carries_the_section_is_no_bridge_error(tmp_path):
    """NVRx finds ``fault_tolerance`` at any depth, so such a file has sections of its own: not a Bridge error."""
    path = tmp_path / "train.yaml"
    path.write_text("model:\n  layers: 2\ntrainer:\n  fault_tolerance:\n    rank_heartbeat_timeout: null\n")
    assert result("config.load", config_path=str(path))["severity"] == "info"
    path.write_text("trainer:\n  steps: 2\n")  # no section anywhere: an unknown section is still an error
    assert result("config.load", config_path=str(path))["severity"] == "error"
