"""Bad input through the real command line: one line saying what is wrong, exit code 2, at once.

Each case runs ``python -m mbr_launch`` as a user would and checks the whole contract: exit code 2 (3 for
``doctor``, whose 2 means "checks found errors"), exactly one line on stderr, no traceback, no
"internal error", and an answer within seconds (no waiting for a rendezvous, a preflight or a worker).
The cases are issue 16's finding 9 and the same class found by trying hostile values on every setting.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest

from testkit.helpers import LAUNCHER, REPO, launcher_env, run_launcher

pytestmark = pytest.mark.timeout(60)

# A rejected input must not reach anything that waits (rendezvous, preflight, workers): the one-line check says
# nothing was started; FAST guards against a silent wait. Not a speed: Python's start-up and the CLI's imports
# take under a second, but a loaded 2-core CI machine (load 10) took 7 s for them, and the waits it guards
# against (a rendezvous' join timeout, 600 s by default) are far longer.
FAST = 15.0
PROC_TIMEOUT = 20.0
LAUNCHER_WORDS = [shlex.quote(word) for word in LAUNCHER]


@dataclass
class Case:
    args: Callable[[Path, int], list[str]]  # (tmp_path, a free port) -> argv after `python -m mbr_launch`
    says: str  # a piece of the one error line
    env: dict[str, str] = field(default_factory=dict)


def _script(tmp: Path) -> str:
    path = tmp / "train.py"
    path.write_text("")
    return str(path)


def _file(tmp: Path, name: str, data: bytes) -> str:
    path = tmp / name
    path.write_bytes(data)
    return str(path)


def _fifo(tmp: Path) -> str:
    os.mkfifo(tmp / "fifo")
    return str(tmp / "fifo")


def _launch(*flags: str) -> Callable[[Path, int], list[str]]:
    return lambda tmp, port: [*flags, _script(tmp)]


# Without the preflight, a case shows only its own failure (this host's warnings, such as other launchers
# running, would add lines of their own); the preflight cases give --skip-check themselves.
SKIP = ("--skip-check", "all")


BAD_YAML = b"mbr_launch:\n  max_restarts: [1\n  nnodes: 2\n"

CASES: dict[str, Case] = {
    # -- issue 16, finding 9 --
    "binary_yaml": Case(lambda tmp, port: ["--config", _file(tmp, "c.yaml", bytes(range(128, 256)) * 4),
                                           _script(tmp)], "is not UTF-8 text"),
    "config_dev_zero": Case(lambda tmp, port: ["--config", "/dev/zero", _script(tmp)], "/dev/zero is a device"),
    "rdzv_conf_join_timeout_abc": Case(_launch("--standalone", "--rdzv-conf", "join_timeout=abc"),
                                       "--rdzv-conf: join_timeout must be a whole number"),
    "preempt_sigkill": Case(_launch("--standalone", "--preempt-signals", "SIGKILL"), "SIGKILL cannot be caught"),
    "handle_sigstop": Case(_launch("--standalone", "--signals-to-handle", "SIGTERM,SIGSTOP"),
                           "SIGSTOP cannot be caught"),
    "skip_unknown_check": Case(_launch("--standalone", "--skip-check", "bogus.id"),
                               "unknown check id(s) bogus.id; valid ids: config.load"),
    "skip_near_miss": Case(_launch("--standalone", "--skip-check", "fs.log_dri"), "did you mean fs.log_dir?"),
    "log_dir_in_proc": Case(_launch("--standalone", "--log-dir", "/proc/mbr-logs"),
                            "--log-dir: cannot create folders in /proc"),
    "log_dir_under_file": Case(lambda tmp, port: ["--standalone", "--log-dir",
                                                  _file(tmp, "plain", b"") + "/logs", _script(tmp)],
                               "is a file, so"),
    "rdzv_id_not_utf8": Case(lambda tmp, port: ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                                                "--rdzv-id", "run\udcff\udcfe", _script(tmp)],
                             "--rdzv-id: the value is not valid UTF-8 text"),
    "yaml_syntax_error": Case(lambda tmp, port: ["--config", _file(tmp, "c.yaml", BAD_YAML), _script(tmp)],
                              "c.yaml:3:9: expected ',' or ']'"),
    "script_is_directory": Case(lambda tmp, port: ["--standalone", str(tmp)], "is a directory"),
    "script_is_fifo": Case(lambda tmp, port: ["--standalone", _fifo(tmp)], "is not a regular file"),
    "script_name_too_long": Case(lambda tmp, port: ["--standalone", str(tmp / ("a" * 300 + ".py"))],
                                 "does not exist"),
    "log_dir_name_too_long": Case(lambda tmp, port: ["--standalone", "--log-dir", str(tmp / ("a" * 300)),
                                                     _script(tmp)], "is longer than this file system's"),
    "empty_nproc_env": Case(_launch("--standalone"), "MBR_NPROC_PER_NODE is set but empty",
                            env={"MBR_NPROC_PER_NODE": ""}),
    "empty_pet_nnodes_env": Case(_launch("--standalone"), "PET_NNODES is set but empty", env={"PET_NNODES": ""}),
    "nnodes_huge": Case(lambda tmp, port: ["--nnodes", "1:99999999999999999999", "--rdzv-backend", "c10d",
                                           "--rdzv-endpoint", f"127.0.0.1:{port}", _script(tmp)],
                        "--nnodes: at most 65536 nodes"),
    # -- the same class, found by trying hostile values --
    "config_fifo": Case(lambda tmp, port: ["--config", _fifo(tmp), _script(tmp)], "is a FIFO"),
    "config_directory": Case(lambda tmp, port: ["--config", str(tmp), _script(tmp)], "is a directory"),
    "config_duplicate_key": Case(lambda tmp, port: [
        "--config", _file(tmp, "c.yaml", b"mbr_launch:\n  max_restarts: 1\n  max_restarts: 5\n"), _script(tmp)],
        "key 'max_restarts' is given twice"),
    "config_deep_nesting": Case(lambda tmp, port: [
        "--config", _file(tmp, "c.yaml", b"mbr_launch:\n  rdzv_id: " + b"[" * 20000 + b"]" * 20000 + b"\n"),
        _script(tmp)], "nested too deeply"),
    "config_null_value": Case(lambda tmp, port: [
        "--config", _file(tmp, "c.yaml", b"mbr_launch:\n  nnodes: null\n"), _script(tmp)],
        "--nnodes: needs a value, not null"),
    "config_mapping_as_id": Case(lambda tmp, port: [
        "--config", _file(tmp, "c.yaml", b"mbr_launch:\n  rdzv_id: {a: 1}\n"), _script(tmp)],
        "'mbr_launch.rdzv_id'"),
    "status_interval_inf": Case(_launch("--standalone", "--status-interval", "inf"), "expected a finite number"),
    "peer_timeout_huge": Case(_launch("--standalone", "--peer-timeout", "1e300"), "must be at most 100000000"),
    "shutdown_timeout_huge": Case(_launch("--standalone", "--shutdown-timeout", "99999999999999999999"),
                                  "must be at most 100000000"),
    "elastic_shutdown_nan": Case(_launch("--standalone"), "TORCH_ELASTIC_SHUTDOWN_TIMEOUT='nan'",
                                 env={"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "nan"}),
    "master_port_out_of_range": Case(_launch("--standalone", "--master-port", "70000"), "must be at most 65535"),
    "nproc_superscript_digit": Case(_launch("--standalone", "--nproc-per-node", "\u00b2"), "--nproc-per-node"),
    "nproc_huge": Case(_launch("--standalone", "--nproc-per-node", "99999999"), "at most 1024 workers per node"),
    "endpoint_port_superscript": Case(_launch("--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:\u00b2"),
                                      "bad port"),
    # ft_launcher 0.6+ reads --ft-rank-heartbeat-timeout '' as none; an empty variable is still no choice.
    "empty_heartbeat_timeout_env": Case(_launch("--standalone"), "MBR_HEARTBEAT_TIMEOUT is set but empty",
                                        env={"MBR_HEARTBEAT_TIMEOUT": ""}),
    "rdzv_conf_float_seconds": Case(_launch("--standalone", "--rdzv-conf", "last_call_timeout=1.5"),
                                    "last_call_timeout must be a whole number"),
    "rdzv_conf_is_host": Case(_launch("--standalone", "--rdzv-conf", "is_host=maybe"), "is_host must be true or false"),
    "negative_local_rank_filter": Case(_launch("--standalone", "--local-ranks-filter", "-1"),
                                       "--local-ranks-filter"),
    "env_not_utf8": Case(lambda tmp, port: ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                                            _script(tmp)],
                         "--rdzv-id: the value is not valid UTF-8 text (got 'run\\udcff') (from the environment "
                         "variable MBR_RDZV_ID)", env={"MBR_RDZV_ID": "run\udcff"}),
    "python_exec_missing": Case(_launch("--standalone"), "PYTHON_EXEC='/nonexistent/python' is not a program",
                                env={"PYTHON_EXEC": "/nonexistent/python"}),
    "empty_bool_env": Case(_launch(), "MBR_STANDALONE is set but empty", env={"MBR_STANDALONE": ""}),
    # -- torchrun's command lines (issue 38): what torchrun refuses, refused here the same way --
    "ambiguous_prefix": Case(_launch("--standalone", "--ma=1"),
                             "ambiguous option: --ma=1 could match --master-addr, --master-port, --max-restarts"),
    "logs_specs_entry_point": Case(_launch("--standalone", "--logs-specs", "mine"),
                                   "--logs-specs mine: mbr-launch loads no torchrun.logs_specs entry point"),
    "rdzv_conf_empty_value": Case(_launch("--standalone", "--rdzv-conf", "join_timeout="),
                                  "--rdzv-conf: join_timeout needs a value"),
    "print_completion_tcsh": Case(lambda tmp, port: ["--print-completion", "tcsh"], "no tcsh"),
}


def _check_one_line(out: subprocess.CompletedProcess, elapsed: float, says: str, code: int = 2) -> None:
    err = out.stderr
    assert "Traceback" not in err and "internal error" not in err, err
    assert out.returncode == code, (out.returncode, err)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("mbr-launch: error: "), err
    assert says in lines[0], lines[0]
    assert elapsed < FAST, f"took {elapsed:.1f} s to refuse: {lines[0]}"


@pytest.mark.processes
@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_one_line_exit_2_at_once(name, tmp_path, port):
    case = CASES[name]
    args = case.args(tmp_path, port)
    if "--skip-check" not in args and args[0] != "doctor":
        args = [*SKIP, *args]
    start = time.monotonic()
    out = run_launcher(args, timeout=PROC_TIMEOUT, env=launcher_env(**case.env))
    _check_one_line(out, time.monotonic() - start, case.says)


@pytest.mark.processes
def test_doctor_json_with_a_yaml_syntax_error_still_prints_json(tmp_path):
    config = _file(tmp_path, "c.yaml", BAD_YAML)
    start = time.monotonic()
    out = run_launcher(["doctor", "--json", "--config", config], timeout=PROC_TIMEOUT)
    # 3: the checks could not run; distinct from 0 ok, 1 warnings, 2 errors found by the checks
    _check_one_line(out, time.monotonic() - start, "c.yaml:3:9", code=3)
    report = json.loads(out.stdout)
    assert report["checks"] == [] and f"{config}:3:9: expected ',' or ']'" in report["error"]
    assert report["version"] == 1 and sum(report["summary"].values()) == 0


@pytest.mark.processes
def test_doctor_json_with_an_unknown_option_still_prints_json():
    out = run_launcher(["doctor", "--json", "--no-such-option"], timeout=PROC_TIMEOUT)
    assert out.returncode == 3, out.stderr
    assert "No such option: --no-such-option" in json.loads(out.stdout)["error"]


@pytest.fixture
def read_only_dir(tmp_path):
    """A read-only tmpfs mounted for the test (needs root with CAP_SYS_ADMIN)."""
    target = tmp_path / "ro"
    target.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(target)],
                             capture_output=True, timeout=10)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield target
    finally:
        subprocess.run(["umount", str(target)], capture_output=True, timeout=10)


@pytest.mark.processes
def test_log_dir_on_a_read_only_filesystem(read_only_dir, tmp_path):
    start = time.monotonic()
    out = run_launcher([*SKIP, "--standalone", "--log-dir", str(read_only_dir / "logs"), _script(tmp_path)],
                       timeout=PROC_TIMEOUT)
    _check_one_line(out, time.monotonic() - start, f"cannot create folders in {read_only_dir}: Read-only file system")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through permission bits")
def test_log_dir_without_write_permission(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    start = time.monotonic()
    out = run_launcher([*SKIP, "--standalone", "--log-dir", str(locked / "logs"), _script(tmp_path)],
                       timeout=PROC_TIMEOUT)
    _check_one_line(out, time.monotonic() - start, "Permission denied")


@pytest.mark.parametrize("argv,closed,code", [
    (["--standalone", "--master-port", "70000", "train.py"], "2>&-", 2),
    (["doctor", "--json", "--config", "bad.yaml"], ">&-", 3),
])
@pytest.mark.processes
def test_exit_code_survives_a_closed_output(tmp_path, argv, closed, code):
    """Started with stdout or stderr closed (Python makes it None), the exit code still tells the story."""
    (tmp_path / "bad.yaml").write_bytes(BAD_YAML)
    command = " ".join(["exec", *LAUNCHER_WORDS, *argv, closed])
    out = subprocess.run(["sh", "-c", command], cwd=tmp_path, capture_output=True, text=True,
                         env=launcher_env(PYTHONPATH=str(REPO)), timeout=PROC_TIMEOUT)
    assert out.returncode == code, out
    assert "Traceback" not in out.stderr + out.stdout
