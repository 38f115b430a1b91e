"""Pure setting resolution and parsing: precedence, strict values, config files."""

from __future__ import annotations

import pytest

from mbr_launch.api import build_launch_config
from mbr_launch.config.errors import ConfigError, SettingError
from mbr_launch.config.files import load_config_file
from mbr_launch.config.parse import (parse_endpoint, parse_nnodes, parse_nproc, parse_ranks_filter,
                                     parse_seconds_env, section_timeouts)
from mbr_launch.config.rdzvconf import check_rdzv_conf, parse_rdzv_conf
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


# ---- hostile values (issue 16): the pure rules under tests/test_bad_input.py's real command lines ----


@pytest.mark.parametrize("environ,needle", [
    ({"MBR_NPROC_PER_NODE": ""}, "MBR_NPROC_PER_NODE is set but empty"),
    ({"PET_NNODES": ""}, "PET_NNODES is set but empty"),
    ({"MBR_STANDALONE": ""}, "MBR_STANDALONE is set but empty"),
    ({"MBR_ROLE": "x\udcff"}, "--role: the value is not valid UTF-8 text"),
    ({"PET_MAX_RESTARTS": "x"}, "(from the environment variable PET_MAX_RESTARTS)"),
])
def test_environment_values_that_are_refused(environ, needle):
    with pytest.raises(SettingError) as err:
        resolve({}, environ, {})
    assert needle in str(err.value)


def test_empty_environment_value_means_unset_where_the_default_is_empty():
    r = resolve({}, {"MBR_RDZV_ENDPOINT": "", "MBR_LOG_DIR": "", "PET_SKIP_CHECK": "", "MBR_RDZV_CONF": ""}, {})
    assert r["rdzv_endpoint"] == "" and r["log_dir"] is None and r.sources["rdzv_endpoint"] == "default"
    # MBR_ is looked at first; an empty one that means unset lets PET_ through
    assert resolve({}, {"MBR_RDZV_ENDPOINT": "", "PET_RDZV_ENDPOINT": "h:1"}, {})["rdzv_endpoint"] == "h:1"
    # a file name may be any bytes; other values must be text
    assert resolve({"log_dir": "/tmp/\udcff"}, {}, {})["log_dir"] == "/tmp/\udcff"


@pytest.mark.parametrize("file_values,result", [
    ({"heartbeat_timeout": None}, ("heartbeat_timeout", None)),  # ft_launcher's null: no timeout
    ({"master_port": None}, ("master_port", None)),  # optional: unset
])
def test_yaml_null_where_it_means_something(file_values, result):
    name, value = result
    assert resolve({}, {}, file_values)[name] == value


@pytest.mark.parametrize("name,value,needle", [
    ("max_restarts", None, "needs a value, not null"),
    ("nnodes", None, "needs a value, not null"),
    ("max_restarts", 2.5, "expected an int"),
    ("max_restarts", True, "expected an int"),
    ("monitor_interval", "inf", "expected a finite number"),
    ("hang_kill_grace", "1e300", "at most 100000000"),
    ("heartbeat_timeout", "1e300", "at most 100000000 seconds"),
    ("heartbeat_timeout", "0", "must be a positive number of seconds"),
    ("shutdown_timeout", "9" * 5000, "expected a finite number"),
    ("master_port", "65536", "at most 65535"),
    ("signals_to_handle", "SIGTERM,SIGKILL", "SIGKILL cannot be caught"),
    ("preempt_signals", "STOP", "SIGSTOP cannot be caught"),
    ("preempt_forward_signal", "\u00b2", "unknown signal"),
    ("no_restart_exit_codes", "\u00b2", "is not an exit code"),
])
def test_hostile_setting_values(name, value, needle):
    with pytest.raises(SettingError) as err:
        resolve({}, {}, {name: value})
    assert needle in str(err.value)


def test_uncatchable_signals_may_still_be_sent():
    assert resolve({"preempt_forward_signal": "SIGKILL"}, {}, {})["preempt_forward_signal"] == "SIGKILL"


def _c10d_conf(text: str) -> list[str]:
    return check_rdzv_conf(parse_rdzv_conf(text), "c10d", lambda: (2, 13))


@pytest.mark.parametrize("parse,text,needle", [
    (lambda t: parse_nnodes(t), "1:99999999999999999999", "at most 65536 nodes"),
    (lambda t: parse_nproc(t, lambda kind: 1), "1025", "at most 1024 workers"),
    (lambda t: parse_nproc(t, lambda kind: 1), "\u00b2", "expected a positive integer"),
    (lambda t: _c10d_conf(t), "join_timeout=abc", "join_timeout must be a whole number"),
    (lambda t: _c10d_conf(t), "read_timeout=0", "read_timeout must be a whole number"),
    (lambda t: _c10d_conf(t), "store_type=redis", "store_type must be tcp or file"),
    (lambda t: parse_endpoint(t), "h:\u00b2", "bad port"),
    (lambda t: parse_ranks_filter(t), "-1", "--local-ranks-filter"),
    (lambda t: parse_seconds_env("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", t), "nan", "from 0 to 100000000"),
])
def test_hostile_launch_shapes(parse, text, needle):
    with pytest.raises(ConfigError) as err:
        parse(text)
    assert needle in str(err.value)


def test_rdzv_conf_keeps_what_torch_reads():
    assert parse_rdzv_conf("join_timeout=60, is_host=0,custom=x") == {"join_timeout": "60", "is_host": "0",
                                                                      "custom": "x"}


@pytest.mark.parametrize("data,needle", [
    (b"\xff\xfe garbage", "is not UTF-8 text (byte 0xff at offset 0)"),
    (b"a: 1\0", "holds a NUL byte"),
    (b"mbr_launch:\n  max_restarts: [1\n  nnodes: 2\n", "c.yaml:3:9: expected ',' or ']'"),
    (b"mbr_launch:\n  nnodes: 1\n  nnodes: 2\n", "c.yaml:3:3: key 'nnodes' is given twice"),
    (b"x: " + b"[" * 20000 + b"]" * 20000, "nested too deeply"),
    (b"mbr_launch:\n  rdzv_id: {a: 1}\n", "'mbr_launch.rdzv_id' in"),
    (b"mbr_launch:\n  nnodes: [1, 2]\n", "must be text or a number, not list"),
    (b"mbr_launch:\n  rdzv_id: 2024-01-01\n", "not date (quote a value"),
    (b"mbr_launch:\n  rdzv_id: \"a\\0b\"\n", "holds a NUL character"),
])
def test_config_file_contents_that_are_refused(tmp_path, data, needle):
    path = tmp_path / "c.yaml"
    path.write_bytes(data)
    with pytest.raises(ConfigError) as err:
        load_config_file(str(path))
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_config_file_lists_where_a_setting_takes_a_list(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("mbr_launch:\n  skip_check: [fs.shm, limits.nofile]\n  no_restart_exit_codes: [3, 4]\n")
    assert load_config_file(str(path)) == {"skip_check": ["fs.shm", "limits.nofile"], "no_restart_exit_codes": [3, 4]}


def test_config_paths_that_are_not_files(tmp_path, monkeypatch):
    import os

    from mbr_launch.config import files

    os.mkfifo(tmp_path / "fifo")
    for path, needle in [(str(tmp_path / "fifo"), "is a FIFO"), ("/dev/zero", "is a device"),
                         (str(tmp_path), "is a directory"), (str(tmp_path / "none.yaml"), "does not exist")]:
        with pytest.raises(ConfigError, match=needle):
            load_config_file(path)
    big = tmp_path / "big.yaml"
    big.write_text("# a comment\n" * 10)
    monkeypatch.setattr(files, "MAX_BYTES", 64)
    with pytest.raises(ConfigError, match="is larger than"):
        load_config_file(str(big))


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
