"""The Megatron-Bridge YAML (``--config``) against the documented resiliency pitfalls; unknown keys."""

from __future__ import annotations

import json
import textwrap

import pytest

from mbr_launch.doctor import DoctorContext, run_checks, to_json
from mbr_launch.doctor.mbridge import load
from mbr_launch.doctor.probes import Versions

pytestmark = pytest.mark.timeout(30)

IPR_ENV = {"TORCH_CPP_LOG_LEVEL": "error", "TORCH_NCCL_RETHROW_CUDA_ERRORS": "0", "NCCL_NVLS_ENABLE": "0"}


@pytest.fixture
def run(tmp_path):
    def go(yaml_text: str, check_id: str, **kw) -> dict:
        path = tmp_path / "cfg.yaml"
        path.write_text(textwrap.dedent(yaml_text))
        kw.setdefault("env", {})
        kw.setdefault("versions", lambda: Versions("2.7.1", "2.27.3", "0.4.1", "12.8"))
        kw.setdefault("other_launchers", lambda: [])
        ctx = DoctorContext.from_values(config_path=str(path), **kw)
        report = json.loads(to_json(run_checks(ctx)))
        [r] = [c for c in report["checks"] if c["id"] == check_id]
        return r

    return go


def test_unknown_key_named_with_path_and_suggestion(run):
    r = run("ft:\n  enable_ft_pakage: true\n", "config.load")
    assert r["severity"] == "error"
    assert "ft.enable_ft_pakage: unknown key; did you mean enable_ft_package?" in r["saw"]


def test_unknown_top_level_and_type_errors(run):
    r = run("inprocess_restarts:\n  enabled: true\ninprocess_restart:\n  hard_timeout: true\n", "config.load")
    assert r["severity"] == "error"
    assert "inprocess_restarts: unknown key; did you mean inprocess_restart?" in r["saw"]
    assert "inprocess_restart.hard_timeout: expected float, got bool" in r["saw"]


def test_loose_sections_name_unrelated_keys_as_info_and_typos_as_errors(run):
    r = run("checkpoint:\n  save_interval: 100\ntrain:\n  train_iters: 10\nmodel:\n  num_layers: 2\n", "config.load")
    assert r["severity"] == "info" and "checkpoint.save_interval" in r["saw"] and "train.train_iters" in r["saw"]
    r = run("checkpoint:\n  async_sav: true\n", "config.load")
    assert r["severity"] == "error" and "did you mean async_save" in r["saw"]


def test_clean_and_broken_files(run, tmp_path):
    assert run("ft:\n  enable_ft_package: true\n", "config.load")["severity"] == "ok"
    assert run("ft: [1, 2\n", "config.load")["severity"] == "error"  # YAML syntax
    ctx = DoctorContext.from_values(config_path=str(tmp_path / "missing.yaml"), env={})
    [r] = [r for r in run_checks(ctx) if r.id == "config.load"]
    assert r.severity == "error" and "does not exist" in r.saw


@pytest.mark.parametrize(
    ("launcher", "severity"), [("torchrun", "error"), ("mbr-launch", "ok"), ("ft_launcher", "ok")]
)
def test_ft_in_config_needs_a_fault_tolerant_launcher(run, launcher, severity):
    r = run("ft:\n  enable_ft_package: true\n", "launcher.torchrun", launcher=launcher)
    assert r["severity"] == severity


@pytest.mark.parametrize(
    ("yaml_text", "severity"),
    [
        ("checkpoint:\n  async_save: true\n", "ok"),  # Bridge's default format is torch_dist
        ("checkpoint:\n  async_save: true\n  ckpt_format: torch_dist\n", "ok"),
        ("checkpoint:\n  async_save: true\n  ckpt_format: zarr\n", "error"),
        ("checkpoint:\n  ckpt_format: zarr\n", "ok"),
    ],
)
def test_async_save_needs_torch_dist(run, yaml_text, severity):
    assert run(yaml_text, "config.async_save")["severity"] == severity


@pytest.mark.parametrize(
    ("yaml_text", "env", "severity"),
    [
        ("inprocess_restart:\n  enabled: true\n", IPR_ENV, "ok"),
        ("inprocess_restart:\n  enabled: true\ntrain:\n  exit_signal_handler: true\n", IPR_ENV, "error"),
        ("inprocess_restart:\n  enabled: true\n", {**IPR_ENV, "NEMORUN_HOME": "/x"}, "warn"),
        ("train:\n  exit_signal_handler: true\n", {}, "skip"),
    ],
)
def test_ipr_with_preemption_or_nemo_run(run, yaml_text, env, severity):
    assert run(yaml_text, "config.ipr_conflicts", env=env)["severity"] == severity


@pytest.mark.parametrize(
    ("yaml_text", "check_id", "severity"),
    [
        ("nvrx_straggler:\n  enabled: true\n  stop_if_detected: true\n", "config.straggler", "ok"),
        ("nvrx_straggler:\n  enabled: true\nstraggler:\n  log_straggler: true\n", "config.straggler", "warn"),
        ("nvrx_straggler:\n  enabled: true\n", "config.straggler_stop", "info"),
        ("nvrx_straggler:\n  enabled: true\n  stop_if_detected: true\n", "config.straggler_stop", "ok"),
        ("rerun_state_machine:\n  check_for_nan_in_loss: true\n", "config.rerun", "ok"),
        ("rerun_state_machine:\n  rerun_mode: validate_results\n", "config.rerun", "warn"),
        ("rerun_state_machine:\n  check_for_spiky_loss: true\n", "config.rerun", "warn"),
        ("checkpoint:\n  non_persistent_ckpt_type: local\n  non_persistent_local_ckpt_dir: /l\n", "config.local_ckpt", "ok"),
        ("checkpoint:\n  non_persistent_ckpt_type: local\n", "config.local_ckpt", "error"),
        ("checkpoint:\n  non_persistent_local_ckpt_dir: /l\n", "config.local_ckpt", "warn"),
        ("ft:\n  enable_ft_package: true\n  simulate_fault: true\n", "config.ft_simulate", "warn"),
    ],
)
def test_config_pitfalls(run, yaml_text, check_id, severity):
    assert run(yaml_text, check_id)["severity"] == severity


@pytest.mark.parametrize(
    ("minutes", "hard", "severity"), [(10, 90, "ok"), (1, 90, "error"), (None, 90, "ok"), (1.5, 90, "error"), (2, 90, "ok")]
)
def test_watchdog_from_config(run, minutes, hard, severity):
    dist = "" if minutes is None else f"dist:\n  distributed_timeout_minutes: {minutes}\n"
    r = run(f"inprocess_restart:\n  enabled: true\n  hard_timeout: {hard}\n{dist}", "ipr.watchdog", env=IPR_ENV)
    assert r["severity"] == severity, r
    if minutes is not None:
        assert "dist.distributed_timeout_minutes" in r["saw"]


def test_config_env_vars_count_but_process_env_wins(run):
    yaml_text = ("inprocess_restart:\n  enabled: true\nenv_vars:\n  NCCL_NVLS_ENABLE: 0\n"
                 "  TORCH_NCCL_RETHROW_CUDA_ERRORS: 0\n")
    assert run(yaml_text, "ipr.nvls")["severity"] == "ok"
    assert run(yaml_text, "ipr.nvls", env={"NCCL_NVLS_ENABLE": "1"})["severity"] == "error"


def test_typed_view(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("inprocess_restart:\n  enabled: true\n  soft_timeout: 30\nft: null\n_target_: x\n")
    cfg = load(p)
    assert cfg.inprocess_restart.soft_timeout == 30 and cfg.inprocess_restart.hard_timeout == 90.0
    assert cfg.ft is None and cfg.problems == ()
