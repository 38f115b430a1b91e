"""Each doctor check through environment matrices (ok / warn / error), asserted through the JSON report.

Probes are replaced only where the machine cannot be made to show the case (GPUs, RDMA, /dev/shm size);
sockets, directories and versions are real elsewhere (tests/test_doctor_probes.py).
"""

from __future__ import annotations

import json

import pytest

from mbr_launch.config.nvrx import NvrxFound
from mbr_launch.doctor import DoctorContext, DoctorError, check_ids, exit_code, run_checks, to_json
from mbr_launch.doctor.probes import GpuInfo, Limit, NvmlView, Versions
from mbr_launch.doctor.processes import LauncherProcess

pytestmark = pytest.mark.timeout(30)

IPR_ENV = {"TORCH_CPP_LOG_LEVEL": "error", "TORCH_NCCL_RETHROW_CUDA_ERRORS": "0", "NCCL_NVLS_ENABLE": "0"}
GOOD_VERSIONS = Versions(torch="2.13.0+cu128", nccl="2.27.3", nvrx="0.4.1", cuda="12.8")


def ctx(**kw) -> DoctorContext:
    kw.setdefault("env", {})
    kw.setdefault("versions", lambda: GOOD_VERSIONS)
    kw.setdefault("other_launchers", lambda: [])
    return DoctorContext.from_values(**kw)


def result(c: DoctorContext, check_id: str) -> dict:
    report = json.loads(to_json(run_checks(c)))
    [found] = [r for r in report["checks"] if r["id"] == check_id]
    assert set(found) == {"id", "severity", "title", "saw", "fix"}
    if found["severity"] in ("warn", "error"):
        assert found["fix"], f"{check_id} reports {found['severity']} without a fix"
    return found


# ---- in-process restart -----------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("env", "check_id", "severity"),
    [
        (IPR_ENV, "ipr.rethrow_cuda_errors", "ok"),
        ({**IPR_ENV, "TORCH_NCCL_RETHROW_CUDA_ERRORS": "1"}, "ipr.rethrow_cuda_errors", "error"),
        ({k: v for k, v in IPR_ENV.items() if k != "TORCH_NCCL_RETHROW_CUDA_ERRORS"}, "ipr.rethrow_cuda_errors", "error"),
        (IPR_ENV, "ipr.nvls", "ok"),
        ({k: v for k, v in IPR_ENV.items() if k != "NCCL_NVLS_ENABLE"}, "ipr.nvls", "error"),
        ({**IPR_ENV, "NCCL_NVLS_ENABLE": "1"}, "ipr.nvls", "error"),
        ({**IPR_ENV, "TORCH_CPP_LOG_LEVEL": "FATAL"}, "ipr.log_level", "ok"),
        ({**IPR_ENV, "TORCH_CPP_LOG_LEVEL": "INFO"}, "ipr.log_level", "warn"),
    ],
)
def test_ipr_env(env, check_id, severity):
    r = result(ctx(env=env, inprocess={"enabled": True}), check_id)
    assert r["severity"] == severity, r
    if severity != "ok":
        assert "export " in r["fix"]


def test_ipr_checks_skip_when_not_enabled():
    c = ctx(env={})
    for cid in ("ipr.rethrow_cuda_errors", "ipr.nvls", "ipr.timeouts", "ipr.watchdog"):
        assert result(c, cid)["severity"] == "skip"
    assert result(ctx(inprocess={"enabled": False}), "ipr.nvls")["severity"] == "skip"


@pytest.mark.parametrize(
    ("settings", "check_id", "severity"),
    [
        ({}, "ipr.timeouts", "ok"),
        ({"soft_timeout": 90, "hard_timeout": 60}, "ipr.timeouts", "error"),
        ({"hard_timeout": 150}, "ipr.timeouts", "error"),  # >= barrier_timeout 120
        ({"soft_timeout": 0}, "ipr.timeouts", "error"),
        ({}, "ipr.heartbeat", "ok"),
        ({"heartbeat_interval": 60, "heartbeat_timeout": 30}, "ipr.heartbeat", "error"),
        ({"heartbeat_timeout": 130}, "ipr.heartbeat", "error"),
    ],
)
def test_ipr_timeouts(settings, check_id, severity):
    r = result(ctx(env=IPR_ENV, inprocess=settings), check_id)
    assert r["severity"] == severity, r


@pytest.mark.parametrize(
    ("pg", "hard", "severity"),
    [(None, 90, "ok"), (1800, 90, "ok"), (90, 90, "error"), (60, 90, "error")],
)
def test_ipr_watchdog(pg, hard, severity):
    r = result(ctx(env=IPR_ENV, inprocess={"hard_timeout": hard}, pg_timeout_s=pg), "ipr.watchdog")
    assert r["severity"] == severity, r
    if pg is None:
        assert "default" in r["saw"]


@pytest.mark.parametrize(
    ("extra", "severity"),
    [
        ({}, "ok"),  # default 480 s > 90 s
        ({"TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "60"}, "error"),
        ({"TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "60", "TORCH_NCCL_ENABLE_MONITORING": "0"}, "ok"),
        ({"TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "soon"}, "error"),
    ],
)
def test_ipr_nccl_heartbeat(extra, severity):
    r = result(ctx(env={**IPR_ENV, **extra}, inprocess={}), "ipr.nccl_heartbeat")
    assert r["severity"] == severity, r


# ---- versions ---------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("versions", "ipr", "check_id", "severity"),
    [
        (GOOD_VERSIONS, True, "versions.torch", "ok"),
        (Versions("2.4.1", "2.27.3", "0.4.1", "12.4"), True, "versions.torch", "error"),
        (Versions("2.4.1", "2.27.3", "0.4.1", "12.4"), False, "versions.torch", "ok"),
        (Versions("2.2.0", None, "0.4.1", None), False, "versions.torch", "error"),
        (Versions(None, None, "0.4.1", None, torch_error="ImportError: x"), False, "versions.torch", "error"),
        (GOOD_VERSIONS, True, "versions.nccl", "ok"),
        (Versions("2.7.1", "2.21.5", "0.4.1", "12.4"), True, "versions.nccl", "error"),
        (Versions("2.7.1", "2.21.5", "0.4.1", "12.4"), False, "versions.nccl", "ok"),
        (Versions("2.9.0", "2.28.3", "0.4.1", "12.9"), True, "versions.nccl", "error"),
        (Versions("2.9.0", "2.28.8", "0.4.1", "12.9"), True, "versions.nccl", "error"),
        (Versions("2.9.0", "2.28.9", "0.4.1", "12.9"), True, "versions.nccl", "ok"),
        (Versions("2.9.0+cpu", None, "0.4.1", None), True, "versions.nccl", "skip"),
    ],
)
def test_versions(versions, ipr, check_id, severity):
    c = ctx(env=IPR_ENV, versions=lambda: versions, inprocess={} if ipr else None)
    r = result(c, check_id)
    assert r["severity"] == severity, r


@pytest.mark.parametrize(("nvrx", "ipr", "severity"),
                         [(None, False, "warn"), (None, True, "error"), ("0.6.0", True, "info"), ("0.4.1", True, "ok")])
def test_nvrx_version_is_the_workers(nvrx, ipr, severity):
    """The NVRx version checked is the one the workers import (tests/test_doctor_nvrx.py has the rest)."""
    c = ctx(env=IPR_ENV, inprocess={} if ipr else None, find_nvrx=lambda env: NvrxFound(nvrx, "/x", "PYTHONPATH"))
    assert result(c, "versions.nvrx")["severity"] == severity


# ---- launcher ----------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("launcher", "ft", "severity"),
    [("mbr-launch", True, "ok"), ("ft_launcher", True, "ok"), ("torchrun", False, "ok"),
     ("torchrun", True, "error"), ("srun", True, "error")],
)
def test_launcher_torchrun(launcher, ft, severity):
    r = result(ctx(launcher=launcher, ft_enabled=ft), "launcher.torchrun")
    assert r["severity"] == severity, r
    if severity == "error":
        assert "mbr-launch" in r["fix"]


SRUN = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_NNODES": "2"}


@pytest.mark.parametrize(
    ("env", "ipr", "ft", "severity"),
    [
        ({}, True, False, "skip"),
        (SRUN, False, False, "ok"),
        ({**SRUN, "SLURM_KILL_BAD_EXIT": "0"}, True, False, "ok"),
        ({**SRUN, "SLURM_KILL_BAD_EXIT": "1"}, True, False, "error"),
        ({**SRUN, "SLURM_KILL_BAD_EXIT": "1"}, False, True, "warn"),
        (SRUN, True, False, "warn"),  # unknown: says how to verify
        (SRUN, False, True, "info"),
    ],
)
def test_srun_kill_on_bad_exit(env, ipr, ft, severity):
    r = result(ctx(env={**IPR_ENV, **env}, inprocess={} if ipr else None, ft_enabled=ft),
               "launcher.srun_kill_on_bad_exit")
    assert r["severity"] == severity, r
    if env == SRUN and ipr:
        assert "scontrol show config" in r["saw"] and "--kill-on-bad-exit=0" in r["fix"]


@pytest.mark.parametrize(
    ("env", "launcher", "others", "severity"),
    [
        ({**SRUN, "SLURM_STEP_TASKS_PER_NODE": "1(x2)"}, "mbr-launch", [], "ok"),
        ({**SRUN, "SLURM_STEP_TASKS_PER_NODE": "8(x2)"}, "mbr-launch", [], "error"),
        ({**SRUN, "SLURM_STEP_TASKS_PER_NODE": "1,2"}, "torchrun", [], "error"),
        ({**SRUN, "SLURM_STEP_TASKS_PER_NODE": "8(x2)"}, "srun", [], "ok"),  # ranks started by srun directly
        ({"SLURM_JOB_ID": "7", "SLURM_NTASKS_PER_NODE": "4"}, "mbr-launch", [], "warn"),
        ({}, "mbr-launch", [], "ok"),
    ],
)
def test_launchers_per_node(env, launcher, others, severity):
    r = result(ctx(env=env, launcher=launcher, other_launchers=lambda: others), "launcher.per_node")
    assert r["severity"] == severity, r


ME, SOMEONE = 1000, 1001
TWO_GPUS = NvmlView(True, driver="550", gpus=(GpuInfo(0, "H100"), GpuInfo(1, "H100")))
NO_GPU = NvmlView(False, "no driver")


def _other(*argv: str, uid: int = ME, devices: str | None = None, read: bool = True) -> LauncherProcess:
    return LauncherProcess(4242, uid, argv, devices, read)


@pytest.mark.parametrize(
    ("other", "view", "ours", "severity", "fix_names_devices"),
    [
        # The same rendezvous endpoint: a second launch of this job here, GPUs or not.
        (_other("torchrun", "--master-port", "29511", "train.py"), NO_GPU, "0", "warn", False),
        (_other("python", "-m", "mbr_launch", "--master_port=29511", "train.py"), NO_GPU, "0", "warn", False),
        # Another user's job, --help, doctor: never this launch's concern.
        (_other("torchrun", "--master-port", "29511", "train.py", uid=SOMEONE), TWO_GPUS, None, "ok", False),
        (_other("ft_launcher", "--help"), TWO_GPUS, None, "ok", False),
        (_other("/usr/bin/python3", "-m", "mbr_launch", "doctor", "--deep"), TWO_GPUS, None, "ok", False),
        (_other("torchrun", "--version"), TWO_GPUS, None, "ok", False),
        # Another job of ours with its own rendezvous: it matters only when it can use our GPUs.
        (_other("torchrun", "--master-port", "29999", "train.py"), NO_GPU, None, "ok", False),
        (_other("torchrun", "--master-port", "29999", "train.py"), TWO_GPUS, None, "warn", True),
        (_other("torchrun", "--master-port", "29999", "train.py", devices="1"), TWO_GPUS, "0", "ok", False),
        (_other("torchrun", "--master-port", "29999", "train.py", devices="0,1"), TWO_GPUS, "1", "warn", True),
        (_other("torchrun", "--master-port", "29999", "train.py", read=False), TWO_GPUS, "0", "warn", True),
    ],
)
def test_per_node_counts_only_launches_that_get_in_the_way(other, view, ours, severity, fix_names_devices):
    env = {} if ours is None else {"CUDA_VISIBLE_DEVICES": ours}
    r = result(ctx(env=env, uid=ME, master_port=29511, nvml=lambda: view, other_launchers=lambda: [other]),
               "launcher.per_node")
    assert r["severity"] == severity, r
    assert ("CUDA_VISIBLE_DEVICES" in r["fix"]) == fix_names_devices, r


@pytest.mark.parametrize(
    ("env", "nnodes", "endpoint", "ft", "severity"),
    [
        ({}, "1", "", True, "ok"),
        ({"SLURM_JOB_ID": "1", "SLURM_PROCID": "1"}, "2", "node0:29400", True, "ok"),
        ({}, "2", "127.0.0.1:29400", True, "error"),
        ({}, "1:4", "127.0.0.1:29400", False, "warn"),
        ({"GROUP_RANK": "x"}, "2", "127.0.0.1:29400", True, "error"),
        ({"GROUP_RANK": "2"}, "2", "127.0.0.1:29400", True, "error"),
        ({"GROUP_RANK": "1", "NODE_RANK": "0"}, "2", "127.0.0.1:29400", True, "warn"),
        ({"GROUP_RANK": "0"}, "2", "127.0.0.1:29400", True, "ok"),  # rank 0 on the rendezvous host
        ({"GROUP_RANK": "0"}, "2", "192.0.2.10:29400", True, "warn"),  # rank 0 elsewhere: duplicated?
        ({"GROUP_RANK": "1"}, "2", "192.0.2.10:29400", True, "ok"),
    ],
)
def test_group_rank(env, nnodes, endpoint, ft, severity):
    """The pitfall of ft_launcher/torchrun launches off Slurm (NVRx reads GROUP_RANK from the environment)."""
    r = result(ctx(env=env, nnodes=nnodes, rdzv_endpoint=endpoint, ft_enabled=ft, launcher="ft_launcher"),
               "launcher.group_rank")
    assert r["severity"] == severity, r


def test_group_rank_is_set_by_mbr_launch():
    r = result(ctx(env={}, nnodes="2", rdzv_endpoint="127.0.0.1:29400", ft_enabled=True, launcher="mbr-launch"),
               "launcher.group_rank")
    assert r["severity"] == "ok" and "from the rendezvous" in r["saw"]


# ---- GPUs --------------------------------------------------------------------------------------------

def gpus(n: int, **bad) -> NvmlView:
    healthy = dict(ecc_uncorrected=0, retired_pending=False, remap_pending=False, remap_failure=False,
                   recovery_action="none")
    return NvmlView(True, driver="570.1", gpus=tuple(
        GpuInfo(i, "H200", **{**healthy, **(bad if i == 1 else {})}) for i in range(n)))


NO_GPU = NvmlView(False, reason="NVML init failed; no NVIDIA driver on this machine")


@pytest.mark.parametrize(
    ("view", "nproc", "env", "severity"),
    [
        (gpus(8), "8", {}, "ok"),
        (gpus(8), "gpu", {}, "ok"),
        (gpus(8), "4", {}, "warn"),
        (gpus(8), "4", {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, "ok"),
        (gpus(4), "8", {}, "error"),
        (gpus(8), "4", {"CUDA_VISIBLE_DEVICES": "0,1,-1,3"}, "error"),
        (gpus(2), "two", {}, "error"),
        (NO_GPU, "8", {}, "skip"),
        (NO_GPU, "cpu", {}, "ok"),
    ],
)
def test_gpu_count(view, nproc, env, severity):
    r = result(ctx(env=env, nvml=lambda: view, nproc_per_node=nproc), "gpu.count")
    assert r["severity"] == severity, r
    if severity == "skip":
        assert r["saw"].startswith("no GPU")


@pytest.mark.parametrize(
    ("view", "check_id", "severity"),
    [
        (gpus(2), "gpu.memory", "ok"),
        (gpus(2, retired_pending=True), "gpu.memory", "warn"),
        (gpus(2, ecc_uncorrected=3), "gpu.memory", "warn"),
        (gpus(2, remap_failure=True), "gpu.memory", "error"),
        (NO_GPU, "gpu.memory", "skip"),
        (gpus(2), "gpu.recovery", "ok"),
        (gpus(2, recovery_action="gpu_reset"), "gpu.recovery", "error"),
        (NvmlView(True, driver="535", gpus=(GpuInfo(0, "A100"),)), "gpu.recovery", "skip"),
        (NO_GPU, "gpu.recovery", "skip"),
    ],
)
def test_gpu_health(view, check_id, severity):
    r = result(ctx(nvml=lambda: view, nproc_per_node="gpu"), check_id)
    assert r["severity"] == severity, r
    if severity != "ok" and view.available and view.gpus[0].recovery_action:
        assert "GPU1" in r["saw"]


# ---- host: shm, limits, disk, rendezvous (injected) ----------------------------------------------------

MiB, GiB = 1 << 20, 1 << 30


@pytest.mark.parametrize(("size", "severity"), [(16 * GiB, "ok"), (512 * MiB, "warn"), (64 * MiB, "error"), (None, "warn")])
def test_shm(size, severity):
    r = result(ctx(shm_bytes=lambda: size), "fs.shm")
    assert r["severity"] == severity, r
    if severity == "error":
        assert "--shm-size" in r["fix"]


def limits(nofile=(1 << 20, 1 << 20), memlock=(None, None)):
    return lambda: {"nofile": Limit(*nofile), "memlock": Limit(*memlock)}


@pytest.mark.parametrize(
    ("lim", "nnodes", "rdma", "check_id", "severity"),
    [
        (limits(), "1", [], "limits.nofile", "ok"),
        (limits(nofile=(4096, 1 << 20)), "1", [], "limits.nofile", "warn"),
        (limits(nofile=(256, 256)), "1", [], "limits.nofile", "error"),
        (limits(), "2", ["mlx5_0"], "limits.memlock", "ok"),
        (limits(memlock=(65536, 65536)), "1", ["mlx5_0"], "limits.memlock", "ok"),
        (limits(memlock=(65536, 65536)), "2", [], "limits.memlock", "info"),
        (limits(memlock=(65536, 65536)), "2", ["mlx5_0"], "limits.memlock", "error"),
    ],
)
def test_limits(lim, nnodes, rdma, check_id, severity):
    r = result(ctx(ulimits=lim, nnodes=nnodes, rdzv_endpoint="127.0.0.1:1", rdma_devices=lambda: rdma), check_id)
    assert r["severity"] == severity, r


def test_nofile_fix_names_reachable_value():
    r = result(ctx(ulimits=limits(nofile=(1024, 4096))), "limits.nofile")
    assert r["severity"] == "warn" and "ulimit -n 4096" in r["fix"]


@pytest.mark.parametrize(("free", "severity"), [(100 * GiB, "ok"), (5 * GiB, "warn"), (100 * MiB, "error")])
def test_disk(free, severity):
    r = result(ctx(disk_paths=["/ckpt", "/data"], disk_free=lambda p: free if p == "/ckpt" else 500 * GiB), "fs.disk")
    assert r["severity"] == severity, r
    assert "/ckpt" in r["saw"]


def test_disk_skips_without_paths():
    assert result(ctx(), "fs.disk")["severity"] == "skip"


# ---- run_checks, skip, exit codes ---------------------------------------------------------------------

def test_unknown_skip_id_names_it_and_lists_valid_ones():
    with pytest.raises(DoctorError) as exc:
        run_checks(ctx(), skip={"ipr.nvsl"})
    assert "ipr.nvsl" in str(exc.value) and "ipr.nvls" in str(exc.value)


def test_skip_overrides_one_check():
    c = ctx(env={}, inprocess={})
    results = {r.id: r for r in run_checks(c, skip={"ipr.nvls"})}
    assert results["ipr.nvls"].severity == "skip" and "--skip-check" in results["ipr.nvls"].saw
    assert results["ipr.rethrow_cuda_errors"].severity == "error"


def test_only_cheap_leaves_out_deep():
    assert "deep.gpu" in check_ids() and "deep.gpu" not in check_ids(only_cheap=True)
    ids = {r.id for r in run_checks(ctx(), only_cheap=True)}
    assert "deep.gpu" not in ids and "ipr.nvls" in ids


def test_crashing_probe_becomes_error_not_exception():
    def boom():
        raise RuntimeError("nvml exploded")

    r = result(ctx(nvml=boom), "gpu.count")
    assert r["severity"] == "error" and "nvml exploded" in r["saw"]


def test_exit_codes_and_summary():
    clean = ctx(env={}, nvml=lambda: NO_GPU, ulimits=limits(), shm_bytes=lambda: 16 * GiB)
    res = run_checks(clean, only_cheap=True)
    assert exit_code(res) == 0, [r for r in res if r.severity in ("warn", "error")]
    warned = run_checks(ctx(env={}, nvml=lambda: NO_GPU, ulimits=limits(), shm_bytes=lambda: 512 * MiB), only_cheap=True)
    assert exit_code(warned) == 1
    broken = run_checks(ctx(env={}, nvml=lambda: NO_GPU, ulimits=limits(), shm_bytes=lambda: 64 * MiB), only_cheap=True)
    assert exit_code(broken) == 2
    report = json.loads(to_json(broken))
    assert report["version"] == 1
    assert report["summary"]["error"] == 1 and sum(report["summary"].values()) == len(report["checks"])


# ---- reverse DNS of the rendezvous addresses ----------------------------------------------------------

@pytest.mark.parametrize("seconds, severity", [(0.01, "ok"), (1.5, "warn"), (None, "warn")])
def test_reverse_dns(seconds, severity):
    asked: list[str] = []

    def lookup(address: str, cap: float):
        asked.append(address)
        return seconds

    c = ctx(nnodes="2", rdzv_endpoint="node1:29400", resolve=lambda _h: ["10.0.0.5"], reverse_lookup=lookup)
    others = set(check_ids()) - {"rdzv.reverse_dns"}  # a deep check of its own: the others start processes
    report = json.loads(to_json(run_checks(c, only_cheap=False, skip=others)))
    [found] = [r for r in report["checks"] if r["id"] == "rdzv.reverse_dns"]
    assert found["severity"] == severity
    # a dual-stack store host sees the IPv4 client as ::ffff:10.0.0.5: both forms are asked (until one is slow)
    assert asked == (["10.0.0.5", "::ffff:10.0.0.5"] if severity == "ok" else ["10.0.0.5"])
    if severity == "warn":
        assert "/etc/hosts" in found["fix"] and "10.0.0.5" in found["saw"]
    single = json.loads(to_json(run_checks(ctx(reverse_lookup=lookup), only_cheap=False, skip=others)))
    assert [r["severity"] for r in single["checks"] if r["id"] == "rdzv.reverse_dns"] == ["skip"]


def test_reverse_dns_probe_times_a_real_lookup():
    from mbr_launch.doctor.probes import reverse_lookup_seconds

    took = reverse_lookup_seconds("127.0.0.1", 5.0)  # /etc/hosts names it on every machine we run on
    assert took is not None and took < 5.0
