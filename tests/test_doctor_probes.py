"""Doctor checks against the real machine: real sockets, directories, rlimits, launcher detection, the
``--deep`` module as a subprocess, and ``run_doctor``'s output. No probe is faked here."""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mbr_launch.doctor import DoctorContext, detect_launcher, preflight, run_checks, run_doctor, to_json
from mbr_launch.doctor.probes import NvmlView
from testkit.helpers import LAUNCHER, launcher_env

pytestmark = pytest.mark.timeout(60)
REPO = Path(__file__).resolve().parents[1]


def result(ctx: DoctorContext, check_id: str) -> dict:
    [r] = [c for c in json.loads(to_json(run_checks(ctx)))["checks"] if c["id"] == check_id]
    return r


def real(**kw) -> DoctorContext:
    kw.setdefault("env", {})
    return DoctorContext.from_values(**kw)


def test_port_in_use_by_a_real_listener(port):
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        r = result(real(rdzv_endpoint=f"127.0.0.1:{port}"), "rdzv.port")
        assert r["severity"] == "error" and str(port) in r["saw"] and "ss -ltnp" in r["fix"]
        r = result(real(rdzv_endpoint=f"localhost:{port}", nnodes="2"), "rdzv.port")
        assert r["severity"] == "warn"  # multi-node: maybe another agent of this job on this host
    assert result(real(rdzv_endpoint=f"127.0.0.1:{port}"), "rdzv.port")["severity"] == "ok"


def test_rendezvous_endpoint_matrix(port):
    assert result(real(standalone=True, nnodes="2"), "rdzv.endpoint")["severity"] == "ok"
    assert result(real(rdzv_endpoint=f"127.0.0.1:{port}", nnodes="2"), "rdzv.endpoint")["severity"] == "ok"
    assert result(real(nnodes="2"), "rdzv.endpoint")["severity"] == "error"
    assert result(real(rdzv_endpoint="node:port", nnodes="2"), "rdzv.endpoint")["severity"] == "error"
    r = result(real(rdzv_endpoint="no-such-host.invalid:29400", nnodes="2"), "rdzv.endpoint")
    assert r["severity"] == "error" and "does not resolve" in r["saw"]


def test_remote_endpoint_reachable_or_not(port):
    # A non-local address of this host is not available in every sandbox; use a real listener reached
    # through a probe that treats nothing as local, so the reachability path runs against real sockets.
    not_local = dict(local_addresses=lambda: set(), rdzv_timeout_s=1.0)
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        r = result(real(rdzv_endpoint=f"127.0.0.1:{port}", nnodes="2", **not_local), "rdzv.endpoint")
        assert r["severity"] == "ok" and "accepts connections" in r["saw"]
    r = result(real(rdzv_endpoint=f"127.0.0.1:{port}", nnodes="2", **not_local), "rdzv.endpoint")
    assert r["severity"] == "warn" and "has not started yet" in r["saw"]


def test_log_dir_matrix(tmp_path):
    assert result(real(log_dir=str(tmp_path)), "fs.log_dir")["severity"] == "ok"
    r = result(real(log_dir=str(tmp_path / "new" / "deeper")), "fs.log_dir")
    assert r["severity"] == "ok" and "will be created" in r["saw"]
    afile = tmp_path / "afile"
    afile.write_text("x")
    r = result(real(log_dir=str(afile / "logs")), "fs.log_dir")  # root ignores mode bits, not this
    assert r["severity"] == "error" and "not a directory" in r["saw"]
    r = result(real(log_dir="/proc/mbr-logs"), "fs.log_dir")
    assert r["severity"] == "error" and "cannot write" in r["saw"]
    assert result(real(), "fs.log_dir")["severity"] == "skip"
    assert not list(tmp_path.glob(".mbr-doctor-*"))  # the write probe cleans up


def test_disk_real(tmp_path):
    r = result(real(disk_paths=[str(tmp_path), str(tmp_path / "not" / "yet")]), "fs.disk")
    assert r["severity"] in ("ok", "warn", "error") and str(tmp_path) in r["saw"]


def test_shm_real():
    r = result(real(), "fs.shm")
    assert r["severity"] in ("ok", "warn", "error") and "/dev/shm" in r["saw"]


SNIPPET = (
    "import json; from mbr_launch.doctor import DoctorContext, run_checks, to_json;"
    "rs = run_checks(DoctorContext.from_values(env={}, nnodes='{nnodes}', rdzv_endpoint='127.0.0.1:1'));"
    "print(to_json([r for r in rs if r.id == '{check}']))"
)


def in_prlimit(limit: str, check: str, nnodes: str = "1") -> dict:
    code = SNIPPET.replace("{nnodes}", nnodes).replace("{check}", check)
    out = subprocess.run(["prlimit", limit, sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, cwd=REPO, check=True)
    [r] = json.loads(out.stdout)["checks"]
    return r


def _hard(kind: int) -> int:
    import resource

    hard = resource.getrlimit(kind)[1]
    return sys.maxsize if hard == resource.RLIM_INFINITY else hard


@pytest.mark.parametrize(("limit", "severity"), [("--nofile=256:256", "error"), ("--nofile=4096:4096", "warn"),
                                                 ("--nofile=65536:65536", "ok")])
@pytest.mark.processes
def test_nofile_real_rlimit(limit, severity):
    import resource

    if int(limit.split(":")[-1]) > _hard(resource.RLIMIT_NOFILE):
        pytest.skip("this sandbox's hard nofile limit is below 65536 and we may not raise it")
    r = in_prlimit(limit, "limits.nofile")
    assert r["severity"] == severity, r


@pytest.mark.processes
def test_a_low_soft_nofile_under_a_high_hard_one_is_raised_not_warned():
    """A soft 1024 under a high hard limit (the common default): the launcher raises its own soft limit to the
    hard one (up to 65536), as servers do, and its workers inherit it; no warning."""
    import resource

    hard = min(_hard(resource.RLIMIT_NOFILE), 65536)
    if hard < 16384:
        pytest.skip("this sandbox's hard nofile limit is below 16384 and we may not raise it")
    probe = ("import resource, sys; sys.argv = ['mbr-launch', 'doctor', '--json'];"
             "from mbr_launch.cli import process; process.prepare();"
             "print(resource.getrlimit(resource.RLIMIT_NOFILE)[0]);"
             "from mbr_launch import nofile; print(*nofile.raised)")
    limit = f"--nofile=1024:{hard}"
    out = subprocess.run(["prlimit", limit, sys.executable, "-c", probe], capture_output=True,
                         text=True, timeout=60, cwd=REPO, check=True)
    assert out.stdout.split() == [str(hard), "1024", str(hard)], out  # raised, and it says so (the start event)
    doctor = subprocess.run(["prlimit", limit, *LAUNCHER, "doctor", "--json"], capture_output=True,
                            text=True, timeout=120, cwd=REPO, env=launcher_env())
    [r] = [c for c in json.loads(doctor.stdout)["checks"] if c["id"] == "limits.nofile"]
    assert r["severity"] == "ok" and f"soft={hard}" in r["saw"], r


def test_memlock_real_rlimit():
    import resource

    if _hard(resource.RLIMIT_MEMLOCK) != sys.maxsize:
        pytest.skip("memlock hard limit is finite here: cannot show the unlimited case")
    assert in_prlimit("--memlock=unlimited:unlimited", "limits.memlock", nnodes="2")["severity"] == "ok"
    r = in_prlimit("--memlock=65536:65536", "limits.memlock", nnodes="2")
    _assert_limited_memlock(r)


@pytest.mark.processes
def test_memlock_limited_real_rlimit():
    _assert_limited_memlock(in_prlimit("--memlock=65536:65536", "limits.memlock", nnodes="2"))
    assert in_prlimit("--memlock=65536:65536", "limits.memlock", nnodes="1")["severity"] == "ok"


def _assert_limited_memlock(r: dict) -> None:
    expected = "error" if os.path.isdir("/sys/class/infiniband") and os.listdir("/sys/class/infiniband") else "info"
    assert r["severity"] == expected and "65536" in r["saw"]


def test_detect_launcher_from_env_and_parents():
    assert detect_launcher({"TORCHELASTIC_RUN_ID": "x"}, parents=[]) == "torchrun"
    assert detect_launcher({"TORCHELASTIC_RUN_ID": "x", "MBR_STACK_FILE": "/f"}, parents=[]) == "mbr-launch"
    assert detect_launcher({"TORCHELASTIC_RUN_ID": "x", "FT_RANK_MONITOR_IPC_SOCKET": "/s"}, parents=[]) == "ft_launcher"
    assert detect_launcher({}, parents=[["/usr/bin/python3", "-m", "torch.distributed.run", "t.py"]]) == "torchrun"
    assert detect_launcher({}, parents=[["/venv/bin/torchrun", "--nproc-per-node", "2"]]) == "torchrun"
    assert detect_launcher({"SLURM_STEP_ID": "0"}, parents=[["bash"]]) == "srun"
    assert detect_launcher({}, parents=[["bash"]]) == "none"


@pytest.mark.processes
def test_detect_plain_torchrun_through_a_real_parent(tmp_path):
    # A real process named torchrun starts python, which asks who launched it.
    fake = tmp_path / "torchrun"
    fake.write_text(f"#!/bin/sh\n{sys.executable} -c 'from mbr_launch.doctor import detect_launcher; "
                    "print(detect_launcher({}))'\n")
    fake.chmod(0o755)
    out = subprocess.run([str(fake)], capture_output=True, text=True, timeout=30, cwd=REPO, check=True)
    assert out.stdout.strip() == "torchrun"


def test_run_doctor_json_and_table(capsys):
    ctx = real(env={}, inprocess={}, nvml=lambda: NvmlView(False, "no driver"))
    # --deep itself runs in test_cli_ux (gloo without a GPU); skipped here, it still has its row.
    code = run_doctor(ctx, deep=True, as_json=True, skip={"limits.nofile", "deep.gpu"})
    report = json.loads(capsys.readouterr().out)
    assert code == 2  # IPR env vars missing
    ids = [c["id"] for c in report["checks"]]
    assert "deep.gpu" in ids and len(ids) == len(set(ids))
    assert report["versions"]["mbr-launch"]
    from rich.console import Console

    buf = io.StringIO()
    code = run_doctor(ctx, deep=False, as_json=False, skip=set(), console=Console(file=buf, width=200))
    text = buf.getvalue()
    assert code == 2 and "ipr.nvls" in text and "NCCL_NVLS_ENABLE" in text and "deep.gpu" not in text


def test_preflight_prints_fixes_and_refuses_on_errors():
    from rich.console import Console

    buf = io.StringIO()
    assert not preflight(real(env={}, inprocess={}), console=Console(file=buf, width=200))
    assert "export NCCL_NVLS_ENABLE=0" in buf.getvalue() and "--skip-check ipr.nvls" in buf.getvalue()
    env = {"TORCH_CPP_LOG_LEVEL": "error", "TORCH_NCCL_RETHROW_CUDA_ERRORS": "0", "NCCL_NVLS_ENABLE": "0"}
    buf = io.StringIO()
    assert preflight(real(env=env, inprocess={}), skip={"fs.shm", "limits.nofile"}, console=Console(file=buf))


def _orphan(command: str, env: dict[str, str] | None = None) -> int:
    """Start ``command`` through a shell that exits at once: the process is no descendant of ours (as another
    user's or another shell's launcher would be). Returns its pid once it runs the command itself."""
    out = subprocess.run(["bash", "-c", f"{command} >/dev/null 2>&1 & echo $!"], capture_output=True, text=True,
                         timeout=10, check=True, env={**os.environ, **(env or {})})
    pid = int(out.stdout)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            if not Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"bash"):
                return pid
        except OSError:
            break
        time.sleep(0.02)
    raise AssertionError(f"{command!r} did not start")


@pytest.mark.processes
def test_other_launchers_read_from_proc():
    """The scan for other launchers (launcher.per_node), against real processes: an agent outside our tree is
    found with its owner and CUDA_VISIBLE_DEVICES; our own descendants, a standby's title and a process named
    as a launcher's helper are not."""
    from mbr_launch.doctor.processes import other_launchers

    sleeper = f"{sys.executable} -c 'import time; time.sleep(60)'"
    named = (f"{sys.executable} -c 'import ctypes, time; "
             "ctypes.CDLL(None).prctl(15, b\"mbr-monitor\", 0, 0, 0); time.sleep(60)'")  # PR_SET_NAME
    pids: list[int] = []
    child = subprocess.Popen(["bash", "-c", "exec -a torchrun sleep 60"])
    try:
        pids.append(agent := _orphan("exec -a torchrun sleep 60", {"CUDA_VISIBLE_DEVICES": "3"}))
        pids.append(standby := _orphan(f"exec -a 'mbr-launch standby for local rank 0' {sleeper}"))
        pids.append(helper := _orphan(f"exec -a mbr-launch {named}"))
        pids.append(module := _orphan(f"exec -a python3 {sys.executable} -c 'import time; time.sleep(60)' "
                                      "-m torch.distributed.run"))
        deadline = time.monotonic() + 10
        while Path(f"/proc/{helper}/comm").read_text().strip() != "mbr-monitor" and time.monotonic() < deadline:
            time.sleep(0.02)
        found = {p.pid: p for p in other_launchers()}
        assert agent in found and found[agent].argv == ("torchrun", "60")
        assert found[agent].uid == os.getuid() and found[agent].env_read and found[agent].visible_devices == "3"
        # the first three words name the launcher: `python -c CODE -m torch.distributed.run` is no launcher
        assert module not in found and standby not in found and helper not in found and child.pid not in found
        assert os.getpid() not in found
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        child.kill()
        child.wait()


def test_installed_versions_agree_with_importlib_metadata(tmp_path, monkeypatch):
    """report.version reads pip's metadata folders itself; it must name the version importlib.metadata
    names, for the real installs and for a folder earlier on sys.path that shadows one."""
    import importlib.metadata

    from mbr_launch.report.version import installed

    def reference(dist: str) -> str | None:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return None

    for dist in ("torch", "nvidia-resiliency-ext", "nvidia_resiliency_ext", "psutil", "PyYAML", "no-such-dist"):
        assert installed(dist) == reference(dist), dist
    shadow = tmp_path / "Nvidia_Resiliency.Ext-9.9.dist-info"
    shadow.mkdir()
    (shadow / "METADATA").write_text("Metadata-Version: 2.1\nName: nvidia-resiliency-ext\nVersion: 9.9rc1\n\nVersion: 0\n")
    egg = tmp_path / "oldstyle.egg-info"
    egg.mkdir()
    (egg / "PKG-INFO").write_text("Metadata-Version: 1.0\nName: oldstyle\nVersion: 1.2.3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    assert installed("nvidia-resiliency-ext") == reference("nvidia-resiliency-ext") == "9.9rc1"
    assert installed("oldstyle") == reference("oldstyle") == "1.2.3"
