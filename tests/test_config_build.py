"""build_config with fake host probes: every rule of the launch's shape, no sockets, DNS, torch or processes."""

from __future__ import annotations

import dataclasses

import pytest

from mbr_launch.api import build_launch_config
from mbr_launch.cli.app import main
from mbr_launch.config.build import build_config
from mbr_launch.config.errors import ConfigError, SettingError
from mbr_launch.config.host import HostProbes
from mbr_launch.config.model import LaunchConfig
from mbr_launch.config.settings import resolve
from mbr_launch.report import exitcodes

pytestmark = pytest.mark.timeout(30)


def _never(*args: object) -> bool:
    raise AssertionError(f"build_config asked the host unexpectedly: {args}")


# Every probe fails the test when called, except that the script exists.
OFFLINE = HostProbes(device_count=_never, is_local_host=_never, port_taken=_never,  # type: ignore[arg-type]
                     listener_is_launcher=_never, is_file=lambda path: True, is_dir=_never, exists=_never,
                     program_exists=_never, log_dir_problem=_never, stdlib_only_script=lambda path: False)


def build(cli: dict, *, environ: dict | None = None, probes: HostProbes = OFFLINE, **kwargs) -> LaunchConfig:
    return build_config(resolve(cli, environ or {}, {}), script="train.py", environ=environ or {}, probes=probes,
                        new_run_id=lambda: "fresh", **kwargs)


def test_single_node_is_a_private_c10d_rendezvous_without_asking_the_host():
    cfg = build({"nproc_per_node": "2"})
    r = cfg.rendezvous
    assert (r.backend, r.endpoint, r.run_id, r.standalone) == ("c10d", "localhost:0", "fresh", True)
    assert (r.min_nodes, r.max_nodes, r.join_timeout, r.peer_timeout) == (1, 1, 600.0, 15.0)
    assert cfg.workers.nproc_per_node == 2 and cfg.workers.omp_num_threads == "1"
    assert cfg.workers.entrypoint[-3:] == ("-m", "mbr_launch.shim.boot", "train.py") and cfg.workers.use_boot


def test_no_raw_settings_and_max_restarts_only_in_the_policy():
    cfg = build({"max_restarts": "3", "no_restart_exit_codes": "2"})
    names = {f.name for f in dataclasses.fields(cfg)}
    assert "settings" not in names and "max_restarts" not in names
    assert cfg.policy.max_restarts == 3 and cfg.policy.no_restart_exit_codes == (2,)
    assert cfg.policy.min_nodes == cfg.rendezvous.min_nodes


def test_nproc_device_kinds_ask_the_injected_counter():
    asked: list[str] = []

    def count(kind: str) -> int:
        asked.append(kind)
        return 0 if kind == "xpu" else 4

    probes = dataclasses.replace(OFFLINE, device_count=count)
    assert build({"nproc_per_node": "gpu"}, probes=probes).workers.nproc_per_node == 4
    with pytest.raises(ConfigError, match="no xpu devices"):
        build({"nproc_per_node": "xpu"}, probes=probes)
    assert asked == ["gpu", "xpu"]


def _taken(by_launcher: bool) -> HostProbes:
    return dataclasses.replace(OFFLINE, is_local_host=lambda host: host == "localhost",
                               port_taken=lambda host, port: port == 29400,
                               listener_is_launcher=lambda port: by_launcher)


def test_c10d_port_taken_by_another_program_is_refused():
    cli = {"rdzv_backend": "c10d", "rdzv_endpoint": "localhost"}  # no port: torchrun's 29400
    with pytest.raises(ConfigError, match="port 29400 on localhost is in use by another program"):
        build(cli, probes=_taken(by_launcher=False))
    assert build(cli, probes=_taken(by_launcher=True)).rendezvous.endpoint == "localhost:29400"


def test_static_rank0_needs_its_port_free():
    cli = {"nnodes": "2", "master_addr": "localhost", "master_port": "29400"}
    with pytest.raises(ConfigError, match="rank 0 must host the store"):
        build(cli, probes=_taken(by_launcher=True))
    cfg = build({**cli, "node_rank": "1"}, probes=_taken(by_launcher=True))
    assert cfg.rendezvous.backend == "static" and cfg.rendezvous.conf["rank"] == 1


def test_remote_endpoint_checks_no_port():
    probes = dataclasses.replace(OFFLINE, is_local_host=lambda host: False)
    cfg = build({"nnodes": "1:4", "rdzv_backend": "c10d", "rdzv_endpoint": "head:1234",
                 "rdzv_conf": "join_timeout=90", "peer_timeout": "7.5"}, probes=probes)
    r = cfg.rendezvous
    assert (r.endpoint, r.min_nodes, r.max_nodes, r.join_timeout, r.peer_timeout) == ("head:1234", 1, 4, 90.0, 7.5)


@pytest.mark.parametrize("value", ["0", "-1", "0.0"])
def test_peer_timeout_must_be_positive(tmp_path, value):
    with pytest.raises(SettingError, match="--peer-timeout: must be positive"):
        resolve({"peer_timeout": value}, {}, {})
    script = tmp_path / "s.py"
    script.write_text("")
    with pytest.raises(ConfigError, match="must be positive"):
        build_launch_config(cli={"peer_timeout": value}, script=str(script), environ={})


def test_peer_timeout_zero_exits_with_usage_code(tmp_path, capsys, monkeypatch):
    script = tmp_path / "s.py"
    script.write_text("")
    assert main(["--peer-timeout", "0", str(script)]) == exitcodes.USAGE == 2
    assert "--peer-timeout: must be positive" in capsys.readouterr().err


def test_missing_script_and_program():
    gone = dataclasses.replace(OFFLINE, is_file=lambda path: False, program_exists=lambda program: False,
                               is_dir=lambda path: False, exists=lambda path: False)
    with pytest.raises(ConfigError, match="training script train.py does not exist"):
        build({}, probes=gone)
    with pytest.raises(ConfigError, match="training script train.py is a directory"):
        build({}, probes=dataclasses.replace(gone, is_dir=lambda path: True, exists=lambda path: True))
    with pytest.raises(ConfigError, match="training script train.py is not a regular file"):
        build({}, probes=dataclasses.replace(gone, exists=lambda path: True))
    with pytest.raises(ConfigError, match="--no-python"):
        build({"no_python": True}, probes=gone)
    with pytest.raises(ConfigError, match="missing the training script"):
        build_config(resolve({}, {}, {}), script=None, environ={}, probes=OFFLINE)


def test_log_dir_problem_is_refused_before_anything_starts():
    probes = dataclasses.replace(OFFLINE, log_dir_problem=lambda path: f"{path} exists and is not a directory")
    with pytest.raises(ConfigError, match="--log-dir: /x exists and is not a directory; give a directory"):
        build({"log_dir": "/x"}, probes=probes)
    assert build({"log_dir": "/y"}, probes=dataclasses.replace(OFFLINE, log_dir_problem=lambda path: None))


def test_log_dir_probe_on_this_host(tmp_path):
    from mbr_launch.config.host import log_dir_problem

    (tmp_path / "file").write_text("")
    assert log_dir_problem(str(tmp_path / "new" / "deeper")) is None
    assert not (tmp_path / "new").exists() and list(tmp_path.iterdir()) == [tmp_path / "file"]  # probe removed
    assert log_dir_problem(str(tmp_path / "file")) == f"{tmp_path / 'file'} exists and is not a directory"
    assert "is a file" in log_dir_problem(str(tmp_path / "file" / "sub"))
    assert "cannot create folders in /proc" in log_dir_problem("/proc/mbr-launch-logs")


def test_output_telemetry_standby_and_preemption_specs():
    cfg = build({"tee": "0:3", "redirects": "2", "local_ranks_filter": "0,1", "quiet": True, "status": "plain",
                 "autobeat": "off", "step_timeout": "none", "standby": "cuda", "standby_preload": "torch._dynamo",
                 "preempt_signals": "USR1", "shutdown_timeout": "12", "requeue_on_preemption": True},
                environ={"OMP_NUM_THREADS": "4"})
    out = cfg.output
    assert (out.tee.for_rank(0), out.tee.for_rank(1), out.redirects.for_rank(5)) == (3, 0, 2)
    assert out.local_ranks_filter == frozenset({0, 1}) and out.quiet and out.status == "plain"
    assert cfg.telemetry.autobeat is False and cfg.telemetry.step_timeout is None
    assert (cfg.standby.level, cfg.standby.preload) == ("cuda", ("torch._dynamo",))
    p = cfg.preemption
    assert (p.signals, p.forward_signal, p.grace, p.requeue) == (("SIGUSR1",), "SIGTERM", 12.0, True)
    assert cfg.workers.shutdown_timeout == 12.0 and cfg.workers.omp_num_threads is None


def test_shutdown_timeout_from_torch_environment():
    cfg = build({}, environ={"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "7"})
    assert cfg.workers.shutdown_timeout == 7.0 and cfg.preemption.grace == 7.0
    with pytest.raises(ConfigError, match="TORCH_ELASTIC_SHUTDOWN_TIMEOUT"):
        build({}, environ={"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "soon"})


def test_slurm_step_fills_in_the_rendezvous():
    step = {"SLURM_JOB_ID": "812", "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "gpu-a[01-02]",
            "SLURM_STEP_NUM_NODES": "2", "SLURM_NODEID": "1", "SLURM_PROCID": "1",
            "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURMD_NODENAME": "gpu-a02"}
    probes = dataclasses.replace(OFFLINE, is_local_host=lambda host: False)
    cfg = build({}, environ=step, probes=probes)
    r = cfg.rendezvous
    assert (r.backend, r.min_nodes, r.node_rank, r.run_id) == ("c10d", 2, 1, "slurm-812-0-r0")
    assert cfg.slurm is not None and r.endpoint == f"gpu-a01:{cfg.slurm.rdzv_port()}"
    assert build({"slurm_rdzv_port": "31000"}, environ=step, probes=probes).rendezvous.endpoint == "gpu-a01:31000"


def test_preflight_spec_is_the_declared_view():
    cfg = build({"heartbeat_timeout": "60", "skip_check": "gpu.nvml,all", "pg_timeout": "1800"})
    pre = cfg.preflight
    assert pre.ft_declared and pre.skip_checks == ("gpu.nvml", "all") and pre.pg_timeout == 1800.0
    assert (pre.nnodes, pre.rdzv_backend, pre.standalone) == ("1:1", "static", False)
    assert build({"rank_monitor": "off"}).preflight.ft_declared is False


def test_min_healthy_reaches_the_policy_and_refuses_a_local_restart_scope():
    cfg = build({"restart_policy": "min-healthy"})
    assert cfg.policy.when == "min-healthy" and cfg.policy.min_healthy
    assert build({}).policy.when == "any-failed"
    with pytest.raises(ConfigError, match="--restart-policy min-healthy leaves a crashed rank lost"):
        build({"restart_policy": "min-healthy", "restart_scope": "rank"})


def test_standby_preload_default_explicit_and_none():
    # Not given: the level's default list (torch._dynamo at torch and cuda, quiet if torch has none).
    for level in ("torch", "cuda"):
        spec = build({"standby": level}).standby
        assert (spec.preload, spec.preload_default) == (("torch._dynamo",), True)
    assert build({}).standby.preload == ("torch._dynamo",)  # --standby torch is the default level
    assert (build({"standby": "interpreter"}).standby.preload, build({"standby": "off"}).standby.preload) == ((), ())
    # Given: replaces the default list, and a module that fails is reported (not the default's quiet).
    spec = build({"standby_preload": "wave,megatron.core"}).standby
    assert (spec.preload, spec.preload_default) == (("wave", "megatron.core"), False)
    assert build({"standby": "interpreter", "standby_preload": "torch._dynamo"}).standby.preload == ("torch._dynamo",)
    # none, an empty value, the environment variable, a config file's empty list: nothing beyond the level.
    for cli, environ in (({"standby_preload": "none"}, {}), ({"standby_preload": ""}, {}),
                         ({}, {"MBR_STANDBY_PRELOAD": "none"}), ({"standby_preload": []}, {})):
        spec = build(cli, environ=environ).standby
        assert (spec.preload, spec.preload_default) == ((), False), (cli, environ)
    assert build({"standby": "off", "standby_preload": "none"}).standby.preload == ()
    with pytest.raises(SettingError, match="none stands alone"):
        build({"standby_preload": "none,wave"})
    with pytest.raises(ConfigError, match="--standby-preload needs standbys"):
        build({"standby": "off", "standby_preload": "wave"})


def test_the_default_standby_preloads_nothing_for_a_script_of_the_standard_library_only():
    plain = dataclasses.replace(OFFLINE, stdlib_only_script=lambda path: path == "train.py")
    spec = build({}, probes=plain).standby
    assert (spec.level, spec.preload) == ("interpreter", ()) and "standard library" in (spec.why or "")
    assert build({}).standby.level == "torch" and build({}).standby.why is None  # a script that may need torch
    # What the user asked for explicitly is kept, and a module run with -m is not read.
    assert build({"standby": "torch"}, probes=plain).standby.level == "torch"
    assert build({"standby_preload": "json"}, probes=plain).standby.level == "torch"
    assert build({"module": True}, probes=plain).standby.level == "torch"
