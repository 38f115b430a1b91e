"""In-process restart checked against the launcher: how the doctor knows it is on, the restart policy,
MASTER_PORT+1/+2, and TORCH_NCCL_ASYNC_ERROR_HANDLING in the watchdog check; plus the CLI passing the
script through (a real `mbr-launch doctor` run)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from mbr_launch.doctor import DoctorContext, run_checks, to_json
from mbr_launch.doctor.probes import Versions

from testkit.helpers import REPO, launcher_env

pytestmark = pytest.mark.timeout(60)

NVRX_EXAMPLE = REPO / "third_party/nvrx-v0.4.1/examples/fault_tolerance/in_job_and_in_process_example.py"
HEARTBEATS_EXAMPLE = REPO / "third_party/nvrx-v0.4.1/examples/fault_tolerance/train_ddp_heartbeats_api.py"
IPR_ENV = {"TORCH_CPP_LOG_LEVEL": "error", "TORCH_NCCL_RETHROW_CUDA_ERRORS": "0", "NCCL_NVLS_ENABLE": "0"}


def ctx(**kw) -> DoctorContext:
    kw.setdefault("env", {})
    kw.setdefault("versions", lambda: Versions(torch="2.7.1", nccl="2.27.3", nvrx="0.4.1", cuda="12.8"))
    kw.setdefault("other_launchers", lambda: [])
    return DoctorContext.from_values(**kw)


def result(c: DoctorContext, check_id: str) -> dict:
    [found] = [r for r in json.loads(to_json(run_checks(c)))["checks"] if r["id"] == check_id]
    if found["severity"] in ("warn", "error"):
        assert found["fix"], f"{check_id} reports {found['severity']} without a fix"
    return found


# ---- is in-process restart on? ------------------------------------------------------------------

@pytest.mark.parametrize(("source", "on"), [
    ("import nvidia_resiliency_ext.inprocess as inprocess\n", True),
    ("from nvidia_resiliency_ext import fault_tolerance, inprocess\n", True),
    ("from nvidia_resiliency_ext.inprocess import Wrapper\n", True),
    ("import nvidia_resiliency_ext.fault_tolerance as ft\n", False),
    ("import torch\n# a comment about in-process work\n", False),
])
def test_script_source_signals_inprocess_restart(tmp_path, source, on):
    script = tmp_path / "train.py"
    script.write_text(source)
    assert (ctx(script=str(script)).ipr_signal is not None) is on


def test_the_signals_in_order():
    assert ctx().ipr_signal is None
    assert "configuration" in ctx(inprocess={}).ipr_signal
    assert "--inprocess-restart" in ctx(script_args=["--lr", "1", "--inprocess-restart"]).ipr_signal
    assert "in_job_and_in_process_example.py" in ctx(script=str(NVRX_EXAMPLE)).ipr_signal
    assert ctx(script=str(HEARTBEATS_EXAMPLE)).ipr_signal is None
    assert ctx(script="/nonexistent/train.py").ipr_signal is None  # unreadable: no signal, no crash


# ---- the restart policy -------------------------------------------------------------------------

@pytest.mark.parametrize(("launcher", "policy", "nnodes", "severity"), [
    ("mbr-launch", "any-failed", "2:3", "warn"),
    ("ft_launcher", "any-failed", "2:3", "warn"),
    ("mbr-launch", "min-healthy", "2:3", "ok"),
    ("mbr-launch", "min-healthy", "2", "info"),
    ("torchrun", "min-healthy", "2:3", "warn"),
    ("srun", "any-failed", "2", "skip"),
])
def test_restart_policy(launcher, policy, nnodes, severity):
    r = result(ctx(script=str(NVRX_EXAMPLE), launcher=launcher, restart_policy=policy, nnodes=nnodes),
               "ipr.restart_policy")
    assert r["severity"] == severity, r
    if severity == "warn" and launcher != "torchrun":
        assert "--ft-restart-policy min-healthy" in r["fix"]


def test_preflight_takes_the_launchers_restart_policy():
    from mbr_launch.config.build import preflight_spec
    from mbr_launch.config.settings import resolve

    assert preflight_spec(resolve({}, {}, {})).restart_policy == "any-failed"
    assert preflight_spec(resolve({"restart_policy": "min-healthy"}, {}, {})).restart_policy == "min-healthy"


def test_policy_checks_skip_without_inprocess_restart():
    for check_id in ("ipr.restart_policy", "ipr.ports"):
        assert result(ctx(script=str(HEARTBEATS_EXAMPLE)), check_id)["severity"] == "skip"


# ---- MASTER_PORT+1 and +2 -----------------------------------------------------------------------

def _local(**kw) -> DoctorContext:
    return ctx(inprocess={}, env=IPR_ENV, resolve=lambda host: ["127.0.0.1"], local_addresses=lambda: {"127.0.0.1"},
               **kw)


def test_ports_mbr_launch_keeps_them_free():
    assert result(_local(launcher="mbr-launch"), "ipr.ports")["severity"] == "ok"


def test_ports_static_master_port_with_a_taken_neighbour():
    with socket.socket() as sock:  # a real listener on MASTER_PORT+2, the Wrapper's store
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        taken = sock.getsockname()[1]
        r = result(_local(launcher="torchrun", rdzv_backend="static", master_addr="127.0.0.1",
                          master_port=taken - 2), "ipr.ports")
    assert r["severity"] == "warn" and str(taken) in r["saw"], r


def test_ports_static_master_port_free():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        base = sock.getsockname()[1]  # free again once closed; its neighbours almost surely too
    r = result(_local(launcher="torchrun", rdzv_backend="static", master_addr="127.0.0.1", master_port=base,
                      port_free=lambda host, port: True), "ipr.ports")
    assert r["severity"] == "ok" and str(base + 2) in r["saw"], r


def test_ports_ft_launcher_c10d_picks_at_random():
    r = result(_local(launcher="ft_launcher", rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:29400"), "ipr.ports")
    assert r["severity"] == "info" and "mbr-launch" in r["fix"], r


# ---- the NCCL watchdog with TORCH_NCCL_ASYNC_ERROR_HANDLING --------------------------------------

@pytest.mark.parametrize(("handling", "severity"), [(None, "error"), ("1", "error"), ("3", "error"),
                                                    ("0", "ok"), ("2", "ok")])
def test_watchdog_only_matters_when_it_tears_down(handling, severity):
    env = {**IPR_ENV, **({"TORCH_NCCL_ASYNC_ERROR_HANDLING": handling} if handling else {})}
    r = result(ctx(env=env, inprocess={"hard_timeout": 90}, pg_timeout_s=60), "ipr.watchdog")
    assert r["severity"] == severity, r


# ---- through the CLI ----------------------------------------------------------------------------

def _doctor(*args: str) -> dict:
    res = subprocess.run([sys.executable, "-m", "mbr_launch", "doctor", "--json", *args], capture_output=True,
                         text=True, timeout=60, cwd=REPO, env=launcher_env())
    assert res.returncode in (0, 1, 2), res.stderr
    return {r["id"]: r for r in json.loads(res.stdout)["checks"]}


@pytest.mark.processes
def test_doctor_reads_the_script_given_after_the_options():
    checks = _doctor("--nnodes", "2:3", str(NVRX_EXAMPLE), "--device", "cpu")
    assert checks["ipr.restart_policy"]["severity"] == "warn", checks["ipr.restart_policy"]
    assert "in_job_and_in_process_example.py" in checks["ipr.restart_policy"]["saw"]
    assert checks["ipr.ports"]["severity"] == "ok"
    checks = _doctor("--nnodes", "2:3", str(HEARTBEATS_EXAMPLE), "--device", "cpu")
    assert checks["ipr.restart_policy"]["severity"] == "skip"
