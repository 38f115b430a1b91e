"""Pure setting resolution and parsing: precedence, strict values, config files."""

from __future__ import annotations

import pytest

from mbr_launch.api import build_launch_config
from mbr_launch.config.errors import ConfigError, SettingError
from mbr_launch.config.files import load_config_file
from mbr_launch.config.parse import section_timeouts
from mbr_launch.config.settings import resolve


def test_precedence_cli_env_config_default():
    file_values = {"max_restarts": 7, "monitor_interval": 3}
    r = resolve({}, {}, file_values)
    assert r["max_restarts"] == 7 and r.sources["max_restarts"] == "config"
    r = resolve({}, {"PET_MAX_RESTARTS": "5"}, file_values)
    assert r["max_restarts"] == 5 and r.sources["max_restarts"] == "env:PET_MAX_RESTARTS"
    r = resolve({}, {"PET_MAX_RESTARTS": "5", "MBR_MAX_RESTARTS": "6"}, file_values)
    assert r["max_restarts"] == 6
    r = resolve({"max_restarts": "2"}, {"MBR_MAX_RESTARTS": "6"}, file_values)
    assert r["max_restarts"] == 2 and r.sources["max_restarts"] == "cli"
    assert resolve({}, {}, {})["max_restarts"] == 0


def test_section_timeouts_parse():
    assert section_timeouts("setup:600,step:180,checkpointing:420") == {
        "setup": 600.0, "step": 180.0, "checkpointing": 420.0}
    assert section_timeouts("step:none") == {"step": None}
    assert section_timeouts("") == {}


@pytest.mark.parametrize("bad", ["step:abc", "step:-1", "step:180,step:200", "step", ":5", "step:0",
                                 "st ep:5", "step:inf"])
def test_section_timeouts_strict(bad):
    with pytest.raises(SettingError) as err:
        section_timeouts(bad)
    assert "--ft-rank-section-timeouts" in str(err.value)


@pytest.mark.parametrize("name,value", [("heartbeat_timeout", "-3"), ("heartbeat_timeout", "abc"),
                                        ("max_restarts", "-1"), ("max_restarts", "x"),
                                        ("rank_termination_signal", "SIGNOPE"),
                                        ("signals_to_handle", "SIGTERM,BOGUS"),
                                        ("stack_dump", "gdb")])
def test_bad_values_raise(name, value):
    with pytest.raises(SettingError):
        resolve({name: value}, {}, {})


def test_config_file_sections(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("fault_tolerance:\n  rank_heartbeat_timeout: 12\n  rank_section_timeouts:\n"
                    "    step: 5\nmbr_launch:\n  max_restarts: 3\n")
    values = load_config_file(str(path))
    assert values == {"heartbeat_timeout": 12, "section_timeouts": {"step": 5}, "max_restarts": 3}


@pytest.mark.parametrize("text,needle", [
    ("fault_tolerance:\n  rank_heartbeat_timout: 12\n", "fault_tolerance.rank_heartbeat_timout"),
    ("mbr_launch:\n  max_restart: 3\n", "mbr_launch.max_restart"),
    ("other:\n  x: 1\n", "'other'"),
])
def test_config_file_unknown_keys_are_named(tmp_path, text, needle):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config_file(str(path))
    assert needle in str(err.value)


def test_build_config_standalone(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("")
    cfg = build_launch_config(cli={"standalone": True, "nproc_per_node": "2"}, script=str(script), environ={})
    assert cfg.rendezvous.backend == "c10d" and cfg.rendezvous.endpoint == "localhost:0"
    assert cfg.workers.nproc_per_node == 2
    assert cfg.workers.omp_num_threads == "1"
    cfg = build_launch_config(cli={"standalone": True, "nproc_per_node": "2"}, script=str(script),
                              environ={"OMP_NUM_THREADS": "4"})
    assert cfg.workers.omp_num_threads is None


@pytest.mark.parametrize("cli,needle", [
    ({"nnodes": "0"}, "--nnodes"), ({"nnodes": "3:2"}, "--nnodes"), ({"nnodes": "a"}, "--nnodes"),
    ({"nproc_per_node": "-1"}, "--nproc-per-node"), ({"nproc_per_node": "two"}, "--nproc-per-node"),
    ({"redirects": "9"}, "--redirects"), ({"nnodes": "2", "rdzv_backend": "c10d"}, "--rdzv-endpoint"),
    ({"rdzv_backend": "etcd", "rdzv_endpoint": "x:1"}, "etcd"), ({"local_ranks_filter": "a"}, "--local-ranks"),
])
def test_build_config_rejects(tmp_path, cli, needle):
    script = tmp_path / "s.py"
    script.write_text("")
    with pytest.raises(ConfigError) as err:
        build_launch_config(cli=cli, script=str(script), environ={})
    assert needle in str(err.value)


SLURM_STEP = {"SLURM_JOB_ID": "812", "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "gpu-a[01-02]",
              "SLURM_STEP_NUM_NODES": "2", "SLURM_NODEID": "1", "SLURM_PROCID": "1",
              "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURMD_NODENAME": "gpu-a02"}


def test_slurm_derives_what_torchrun_makes_people_type(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("")
    cfg = build_launch_config(cli={"nproc_per_node": "2"}, script=str(script), environ=SLURM_STEP)
    assert (cfg.rendezvous.min_nodes, cfg.rendezvous.max_nodes) == (2, 2)
    assert cfg.rendezvous.backend == "c10d" and cfg.rendezvous.endpoint.startswith("gpu-a01:")
    assert cfg.rendezvous.run_id == "slurm-812-0-r0" and cfg.slurm and cfg.slurm.hostname == "gpu-a02"
    # every node derives the same endpoint
    other = build_launch_config(cli={}, script=str(script), environ={**SLURM_STEP, "SLURM_NODEID": "0"})
    assert other.rendezvous.endpoint == cfg.rendezvous.endpoint
    # explicit flags win
    cfg = build_launch_config(cli={"rdzv_endpoint": "h:1234", "nnodes": "1:2", "rdzv_id": "mine"},
                              script=str(script), environ=SLURM_STEP)
    assert (cfg.rendezvous.endpoint, cfg.rendezvous.min_nodes, cfg.rendezvous.run_id) == ("h:1234", 1, "mine")
    # requeues get a new run id (stale rendezvous state is never reused)
    cfg = build_launch_config(cli={}, script=str(script), environ={**SLURM_STEP, "SLURM_RESTART_COUNT": "1"})
    assert cfg.rendezvous.run_id == "slurm-812-0-r1"


def test_slurm_more_than_one_task_per_node_is_refused(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("")
    with pytest.raises(ConfigError) as err:
        build_launch_config(cli={}, script=str(script),
                            environ={**SLURM_STEP, "SLURM_STEP_TASKS_PER_NODE": "4(x2)"})
    assert "once per node" in str(err.value) and "--ntasks-per-node=1" in str(err.value)


def test_slurm_kill_on_bad_exit_warns(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("")
    cfg = build_launch_config(cli={}, script=str(script), environ={**SLURM_STEP, "SLURM_KILL_BAD_EXIT": "1"})
    assert any("--kill-on-bad-exit=0" in w for w in cfg.warnings)


@pytest.mark.parametrize("text", ["fault_tolerance:\n  restart_policy: min-healthy\n",
                                  "mbr_launch:\n  restart_policy: min-healthy\n"])
def test_restart_policy_from_either_config_section(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    values = load_config_file(str(path))
    assert values == {"restart_policy": "min-healthy"}
    assert resolve({}, {}, values)["restart_policy"] == "min-healthy"
    assert resolve({"restart_policy": "any-failed"}, {}, values)["restart_policy"] == "any-failed"  # the flag wins
    with pytest.raises(SettingError, match="--restart-policy"):
        resolve({"restart_policy": "min_healthy"}, {}, {})
