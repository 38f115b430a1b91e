"""Every option of ft_launcher 0.4.1, 0.6.0 and 0.7.0 is accepted by ``mbr-launch`` with the same arity and
meaning, as ``test_flag_parity`` does for torchrun: a script written for ``ft_launcher ... script.py`` runs
unchanged, no flag's value is ever taken for the training script, and no value ft_launcher takes is refused.

Each version is compared with its own parser and FaultToleranceConfig: two NVRx versions cannot share a process,
so ``tests/scripts/ft_parser_dump.py`` runs once per version (in parallel, once per session) with that version
on PYTHONPATH (``nvrx_versions.nvrx_env``) and dumps the options, the defaults, ``to_yaml_file``'s YAML, what
``FaultToleranceConfig.from_args`` makes of the probe command lines below, and a value each option takes.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import json
import subprocess
import sys
from typing import Any

import pytest
import typer

from mbr_launch.cli.app import app
from mbr_launch.config.build import build_config
from mbr_launch.config.errors import ConfigError, SettingError
from mbr_launch.config.files import load_config_file
from mbr_launch.config.host import HostProbes, workers_nvrx
from mbr_launch.config.model import LaunchConfig
from mbr_launch.config.nvrx import FT_FIELDS, REMOVED_VALUES, NvrxFound, generation, removed_spelling
from mbr_launch.config.parse import as_bool
from mbr_launch.config.settings import BY_NAME, SETTINGS, resolve

from testkit.helpers import SCRIPTS, run_launcher
from testkit.nvrx_versions import ALL, INSTALLED, NEW, nvrx_dir, nvrx_env

pytestmark = [pytest.mark.timeout(120), pytest.mark.processes]

COMMAND = typer.main.get_command(app)
OURS: dict[str, Any] = {opt: p for p in COMMAND.params for opt in getattr(p, "opts", [])}
SETTING_OF = {flag: setting for setting in SETTINGS for flag in setting.flags}
OPTION_COUNTS = {"0.4.1": 97, "0.6.0": 145, "0.7.0": 152}  # option strings, -h/--help left out

# Command lines whose meaning is compared with FaultToleranceConfig.from_args in every version that has the flag.
PROBES: list[list[str]] = [
    *([flag, value] for flag in ("--ft-rank-heartbeat-timeout", "--ft-initial-rank-heartbeat-timeout",
                                 "--ft-rank-out-of-section-timeout")
      for value in ("null", "none", "", "NULL", "None", "42")),
    ["--ft-rank-section-timeouts", "step:null,setup:,ckpt:none,x:7"],
    *(["--ft-log-level", value] for value in ("debug", "Warn", "DBG", "info", "ERROR", "critical")),
    *(["--ft-enable-nic-monitor", value] for value in ("maybe", "False", "0", "yes", "TRUE", "", "x")),
    *(["--ft-skip-section-response", value] for value in ("false", "no", "maybe", "TRUE", "1", "")),
    *([flag, value] for flag in ("--ft-install-exception-hook", "--ft-enable-nic-healthcheck", "--ft-numa-bind-strict",
                                 "--ft-check-remaining-processes")
      for value in ("maybe", "no", "0", "FALSE", "yes", "")),
    *(["--ft-gpu-memory-reclaim-timeout", value] for value in ("0", "12.5")),
    ["--ft-gpu-memory-tolerance-mb", "100"], ["--ft-gpu-memory-poll-interval", "0.5"],
    *(["--ft-max-no-progress-cycles", value] for value in ("2", "0", "-1")),
    ["--ft-min-progress-iterations", "4"], ["--ft-checkpoint-iteration-file", "/ckpt/latest.txt"],
    ["--ft-segment", "1"], ["--ft-link-state-path-template", "/sys/{nic}/state"],
    ["--ft-storage-health-check-path", "/a,/b"], ["--ft-segment-health-check-dir", "/shared/seg"],
    ["--ft-attribution-stop-action", "No-Restart"], ["--ft-attribution-endpoint", "http://h:1"],
    ["--ft-cycle-info-dir", "/c"], ["--ft-rank-termination-signal", "sigterm"], ["--ft-safety-factor", "3.5"],
    ["--ft-param-rank_heartbeat_timeout", "66"], ["--ft_param_enable_nic_monitor", "False"],
]
CANDIDATES = ["/abs/7", "7", "step:7", "debug", "SIGTERM", "true"]
# Where mbr-launch differs from ft_launcher on purpose (docs/ft_launcher.md): 0.4.1's NIC monitor is on by
# default there; mbr-launch runs no NIC monitor and hands clients false unless asked.
DIFFERENT_DEFAULTS = {("0.4.1", "enable_nic_monitor")}


@functools.cache
def dumps() -> dict[str, dict[str, Any]]:
    """Each NVRx version's dump: the venv's 0.4.1 here (this process has torch already, or would import it
    anyway), the others in processes of their own (each imports torch: seconds of CPU), in parallel."""
    request = {"probes": PROBES, "candidates": CANDIDATES}
    procs = {version: subprocess.Popen([sys.executable, str(SCRIPTS / "ft_parser_dump.py")], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                       env=nvrx_env(version)) for version in NEW}
    spec = importlib.util.spec_from_file_location("ft_parser_dump", SCRIPTS / "ft_parser_dump.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    with contextlib.redirect_stderr(io.StringIO()):  # argparse's usage lines for the refused probes
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        out = {INSTALLED: module.dump(request)}
    for version, proc in procs.items():
        stdout, _ = proc.communicate(json.dumps(request), timeout=110)
        assert proc.returncode == 0, f"ft_parser_dump failed for NVRx {version}"
        out[version] = json.loads(stdout)
    return out


def strings(version: str) -> list[str]:
    return [s for action in dumps()[version]["actions"] for s in action["strings"]]


def _params(args: list[str]) -> dict:
    return COMMAND.make_context("mbr-launch", list(args)).params


def _given(args: list[str]) -> dict[str, Any]:
    """What the command line sets, by setting name, as typer hands it to the launch."""
    return {k: v for k, v in _params([*args, "train.py"]).items() if k in BY_NAME and v is not None}


def build(cli: dict[str, Any], version: str | None, file_values: dict | None = None) -> LaunchConfig:
    probes = HostProbes(is_file=lambda path: True, stdlib_only_script=lambda path: False,
                        workers_nvrx=lambda environ: NvrxFound(version))
    return build_config(resolve(cli, {}, file_values or {}), script="train.py", environ={}, probes=probes,
                        new_run_id=lambda: "fresh")


# ---- the parsers compared with are the ones we think -----------------------------------------------------


@pytest.mark.parametrize("version", ALL)
def test_each_parser_is_the_one_we_think(version: str):
    # A guard against comparing with an empty or different parser (the tests would pass vacuously).
    dump = dumps()[version]
    assert dump["version"] == version and len(strings(version)) == OPTION_COUNTS[version]
    assert list(dump["fields"]) == list(FT_FIELDS[generation(version)]), "config.nvrx.FT_FIELDS is stale"


def test_spellings_and_values_removed_between_versions_are_the_ones_we_name():
    old, mid, new = (set(strings(v)) for v in ALL)
    assert old - mid == {f for f in old if removed_spelling(f) == "0.6"}
    assert mid - new == {f for f in mid if removed_spelling(f) == "0.7"}
    choices = {v: {a["dest"]: set(a["choices"] or ()) for a in dumps()[v]["actions"]} for v in ALL}
    for (name, value), line in REMOVED_VALUES.items():
        dest = "ft_" + name
        before = "0.4.1" if line == "0.6" else "0.6.0"
        assert value in choices[before][dest] and value not in choices[f"{line}.0"][dest], (name, value)


# ---- every option, its arity, and every value ft_launcher takes ------------------------------------------


@pytest.mark.parametrize("version", ALL)
def test_every_option_is_accepted_with_the_same_arity(version: str):
    wrong = []
    for action in dumps()[version]["actions"]:
        for flag in action["strings"]:
            param = OURS.get(flag)
            if param is None:
                wrong.append(f"{flag}: refused")
            elif action["switch"]:
                if not getattr(param, "is_flag", False) or _params([flag, "train.py"])["training_script"] != "train.py":
                    wrong.append(f"{flag}: a switch in ft_launcher {version}, takes a value here")
            else:
                sample = (action["choices"] or ["7"])[0]
                if getattr(param, "is_flag", False):
                    wrong.append(f"{flag}: takes a value in ft_launcher {version}, a switch here")
                    continue
                # --flag=VALUE for long options; a short one takes "-r7" (argparse and click alike)
                joined_arg = f"{flag}={sample}" if flag.startswith("--") else f"{flag}{sample}"
                spaced, joined = _params([flag, sample, "train.py"]), _params([joined_arg, "train.py"])
                if (spaced["training_script"], joined["training_script"]) != ("train.py", "train.py") or \
                        spaced[param.name] != sample or joined[param.name] != sample:
                    wrong.append(f"{flag} {sample}: read as {spaced[param.name]!r}, "
                                 f"script {spaced['training_script']!r}")
    assert not wrong, f"ft_launcher {version} options mbr-launch gets wrong:\n" + "\n".join(wrong)


@pytest.mark.parametrize("version", ALL)
def test_every_value_ft_launcher_takes_is_taken(version: str):
    """One value per option that ft_launcher takes all the way (its parser, from_args and its start-up checks)
    resolves here too: 'never refuse a command line ft_launcher accepts'."""
    samples = dumps()[version]["samples"]
    assert len(samples) > OPTION_COUNTS[version] // 3  # most options have one
    refused = []
    for flag, value in samples.items():
        try:
            resolve({SETTING_OF[flag].name: value}, {}, {})
        except SettingError as err:
            refused.append(f"{flag} {value!r}: {err}")
    assert not refused, "\n".join(refused)


@pytest.mark.parametrize("version", ALL)
def test_values_mean_what_they_mean_to_the_same_version(version: str):
    """The NVRx client config each probe command line gives, by ft_launcher of ``version`` (from_args) and by
    mbr-launch with that version in the workers' environment, field by field."""
    differ = []
    for argv, real in zip(PROBES, dumps()[version]["probes"]):
        if "error" in real:
            continue
        ours = build(_given(argv), version).ft.as_nvrx_dict()
        setting = SETTING_OF[argv[0]]
        field = setting.ft_key
        if ours[field] != real["cfg"][field]:
            differ.append(f"{' '.join(map(repr, argv))}: {field} is {ours[field]!r} here, {real['cfg'][field]!r} there")
    assert not differ, f"NVRx {version}:\n" + "\n".join(differ)


def test_the_probes_cover_what_changed():
    """0.6+ reads null/none/'' as no timeout and lower-case levels; 0.4.1 refused both: the probes show it."""
    probes = {json.dumps(argv): i for i, argv in enumerate(PROBES)}
    for argv, refused_by_041 in ((["--ft-rank-heartbeat-timeout", "null"], True), (["--ft-log-level", "debug"], False)):
        i = probes[json.dumps(argv)]
        assert ("error" in dumps()["0.4.1"]["probes"][i]) is refused_by_041
        assert dumps()["0.7.0"]["probes"][i]["cfg"][SETTING_OF[argv[0]].ft_key] in (None, 10)
        assert build(_given(argv), "0.4.1").ft.as_nvrx_dict()[SETTING_OF[argv[0]].ft_key] in (None, 10)


@pytest.mark.parametrize(("version", "word", "value"), [
    ("0.4.1", "maybe", False), ("0.6.0", "maybe", True), ("0.7.0", "maybe", True), ("0.4.1", "off", False),
    ("0.7.0", "off", False), ("0.7.0", "on", True), ("0.4.1", "on", True), (None, "maybe", True)])
def test_nic_monitor_word_follows_the_workers_nvrx(version, word, value):
    cfg = build({"enable_nic_monitor": word}, version)
    assert cfg.ft.enable_nic_monitor is value
    unclear = word not in ("on", "off")
    assert any("--ft-enable-nic-monitor" in w and f"read as {str(value).lower()}" in w for w in cfg.warnings) is unclear


@pytest.mark.parametrize(("name", "value", "needle"), [
    ("ft_log_level", "loud", "any case"), ("ft_log_level", "7", "must be 10 to 50"),
    ("per_cycle_applog_prefix", "logs/job.log", "absolute"), ("storage_health_check_path", "/a,b", "absolute"),
    ("attribution_stop_action", "stop", "log, no-restart"), ("rdzv_impl", "Barrier", "barrier, legacy"),
    ("enable_dist_storage_healthcheck", "maybe", "boolean"), ("segment", "0", "positive"),
    ("heartbeat_timeout", "soon", "'none'")])
def test_values_ft_launcher_refuses_too_are_one_clear_error(name, value, needle):
    with pytest.raises(SettingError, match=needle):
        resolve({name: value}, {}, {})


def test_a_segment_that_does_not_divide_min_nodes_is_refused():
    with pytest.raises(ConfigError, match=r"--ft-segment 3: the minimum number of nodes \(4"):
        build_config(resolve({"segment": "3", "nnodes": "4:8", "rdzv_endpoint": "h:1", "rdzv_backend": "c10d"}, {},
                             {}), script="t.py", environ={}, probes=HostProbes(
            is_file=lambda p: True, is_local_host=lambda h: False, stdlib_only_script=lambda p: False,
            workers_nvrx=lambda e: NvrxFound("0.7.0")))


@pytest.mark.parametrize("flag", ["--term-timeout", "--term_timeout", "--workers-stop-timeout",
                                  "--workers_stop_timeout"])
def test_stop_timeouts_are_the_stop_grace(flag: str):
    assert SETTING_OF[flag].name == "shutdown_timeout"
    assert resolve({"shutdown_timeout": "12.5"}, {}, {})["shutdown_timeout"] == 12.5


@pytest.mark.parametrize("text", ["true", "TRUE", "1", "yes", "on", True])
def test_as_bool_true(text):
    assert as_bool(text) is True


@pytest.mark.parametrize("text", ["false", "FALSE", "0", "no", "off", "", False])
def test_as_bool_false(text):
    assert as_bool(text) is False


# ---- defaults: the workers' NVRx decides where versions disagree -----------------------------------------


@pytest.mark.parametrize("version", ALL)
def test_defaults_are_the_workers_nvrx_defaults(version: str):
    dump = dumps()[version]
    cfg = build({}, version)
    ours = cfg.ft.as_nvrx_dict()
    differ = {f: (ours[f], dump["defaults"][f]) for f in dump["fields"]
              if ours[f] != dump["defaults"][f] and (version, f) not in DIFFERENT_DEFAULTS}
    assert not differ, f"NVRx {version} defaults (ours, theirs): {differ}"
    assert ours["user_set"] == []
    assert cfg.nvrx.workers_nvrx == version
    assert cfg.nvrx.max_no_progress_cycles == dump["defaults"].get("max_no_progress_cycles", 0)
    assert cfg.nvrx.gpu_memory_reclaim_timeout == dump["defaults"].get("gpu_memory_reclaim_timeout", 0.0)


def test_without_nvrx_the_declared_defaults_apply():
    cfg = build({}, None)
    assert (cfg.ft.rank_heartbeat_timeout, cfg.ft.initial_rank_heartbeat_timeout) == (2700.0, 3600.0)
    assert (cfg.nvrx.workers_nvrx, cfg.nvrx.max_no_progress_cycles, cfg.nvrx.enable_nic_healthcheck) == (None, 0, False)


def test_client_config_has_every_07_field_and_what_the_user_set():
    cfg = build(_given(["--ft-rank-heartbeat-timeout", "null", "--ft-log-level", "debug",
                        "--ft-skip-section-response", "false", "--ft-max-no-progress-cycles", "2",
                        "--ft-no-restart-exit-code", "90"]), "0.7.0")
    data = cfg.ft.as_nvrx_dict()
    assert set(data) == {*dumps()["0.7.0"]["fields"], "user_set"}
    assert data["user_set"] == ["log_level", "max_no_progress_cycles", "rank_heartbeat_timeout",
                                "skip_section_response"]  # no_restart_exit_code is the launcher's, not a field
    assert (data["log_level"], data["skip_section_response"], cfg.nvrx.no_restart_exit_code) == (10, False, 90)


def test_the_workers_nvrx_is_found_on_their_path_without_importing_it(tmp_path):
    assert workers_nvrx({}).version == "0.4.1"  # the venv's, through the launcher's own sys.path
    for version in ("0.6.0", "0.7.0"):
        found = workers_nvrx({"PYTHONPATH": f"{tmp_path}:{nvrx_dir(version)}"})
        assert (found.version, found.via, found.generation) == (version, "PYTHONPATH", version[:3])
    assert [generation(v) for v in ("0.4.1", "0.5.0", "0.6.2", "0.7.0rc1", "0.9.0", "x", None)] == \
        ["0.4", "0.4", "0.6", "0.7", "0.7", None, None]


# ---- YAML: each version's fault_tolerance section ------------------------------------------------------


@pytest.mark.parametrize("version", ALL)
def test_each_versions_yaml_is_read_whole(version: str, tmp_path):
    """What NVRx's own ``to_yaml_file`` writes, top level and nested in a training config as NVRx finds it."""
    dump = dumps()[version]
    flat = tmp_path / "flat.yaml"
    flat.write_text(dump["yaml"])
    body = "\n".join("  " + line for line in dump["yaml"].splitlines())
    nested = tmp_path / "nested.yaml"
    nested.write_text(f"model:\n  layers: 2\ntrainer:\n  steps: 5\n{body}\n")
    for path in (flat, nested):
        values = load_config_file(str(path))
        ft = build({}, version, values).ft.as_nvrx_dict()
        assert ft["user_set"] == sorted(dump["fields"])
        assert {f: ft[f] for f in dump["fields"]} == dump["defaults"]


@pytest.mark.parametrize(("text", "needles"), [
    ("fault_tolerance:\n  rank_heartbeat_timout: 3\n", ("did you mean 'rank_heartbeat_timeout'", "fix or remove")),
    ("fault_tolerance:\n  no_restart_exit_code: 3\n", ("not a fault_tolerance key", "--ft-no-restart-exit-code")),
    ("mbr_launch:\n  rank_heartbeat_timeout: 3\n", ("write 'heartbeat_timeout' here",)),
    ("mbr_lanch:\n  x: 1\nfault_tolerance:\n  segment: 2\n", ("did you mean 'mbr_launch'",)),
])
def test_unknown_yaml_keys_say_what_to_do(tmp_path, text, needles):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config_file(str(path))
    assert all(n in str(err.value) for n in needles), str(err.value)


def test_options_page_lists_every_ft_launcher_option():
    from .conftest import REPO

    table = (REPO / "docs/options.md").read_text()
    missing = sorted({f for v in ALL for f in strings(v) if f"`{f}`" not in table and f"`{f} " not in table})
    assert not missing, f"docs/options.md lacks ft_launcher's {missing}: run scripts/gen-docs"


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
