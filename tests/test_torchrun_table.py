"""torchrun command lines, each run under torchrun and under mbr-launch in the same test: the same outcome.

A row is a command line written from torchrun's documentation and parser (one per option family). Both
launchers run it at once, each with its own ports, the same probe (``tests/scripts/table_probe.py``) and the
same environment; the test compares what matters to a user who swaps one for the other: the exit status class
(success, failure, or a refused command line), the files each rank wrote (which ranks, which attempts, the
launch environment each saw, its arguments and ``__name__``), that every rank's output reached a file under
``--log-dir`` when redirected, and the console's line prefix where a template asks for one.

Where the launchers differ on purpose (``MASTER_PORT`` without an explicit ``--master-port``: fresh ports per
round; the run folder's layout), the row or the comparison names it; docs/torchrun.md says why.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest

from testkit.helpers import SCRIPTS, finish, free_port, launcher_env

pytestmark = [pytest.mark.timeout(240), pytest.mark.processes]

PROBE = SCRIPTS / "table_probe.py"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
MBR = [sys.executable, "-m", "mbr_launch"]


@dataclass(frozen=True)
class Where:
    """One launcher's side of a row: its own ports and folders."""

    port: int
    out: Path
    logs: Path
    cwd: Path


@dataclass(frozen=True)
class Row:
    id: str
    args: Callable[[Where], list[str]]  # everything after the launcher, script included
    env: dict[str, str] = field(default_factory=dict)
    agents: int = 1
    outcome: str = "ok"  # torchrun's: ok | failed | refused (exit 2 before any worker ran)
    ours: str = ""  # mbr-launch's where it differs on purpose (docs/torchrun.md says why); else the same
    attempts: tuple[int, ...] = (0,)
    explicit_port: bool = False  # the workers' MASTER_PORT is the user's: compared too
    redirected: bool = False  # every rank's stdout and stderr line is in a file under w.logs
    prefix: str = ""  # the console shows rank 0's line with this prefix (a template's)


def script(w: Where) -> list[str]:
    return [str(PROBE), "first", "--flag=x"]


def c10d(w: Where, nnodes: str = "1") -> list[str]:
    return ["--nnodes", nnodes, "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{w.port}",
            "--rdzv-id", f"table{w.port}"]


ROWS = [
    # Each row is two launches: families share a row where one command line can hold them (CI has 20 minutes).
    Row("nnodes-min-max-underscores", lambda w: ["--nnodes", "1:1", "--nproc_per_node", "2", "--max_restarts", "0",
                                                 "--monitor_interval", "0.1", *script(w)]),
    Row("prefixes-redirects-tee-logs-specs", lambda w: ["--nnode=1", "--max_restart=0", "--redirect=3", "--tee=1",
                                                        "--log_d", str(w.logs), "--logs_specs=default",
                                                        "--nproc_per_node=2", *script(w)], redirected=True),
    Row("ambiguous-prefix-refused", lambda w: ["--log=x", "--nproc-per-node=2", *script(w)], outcome="refused"),
    Row("standalone-restart", lambda w: ["--standalone", "--nproc-per-node=2", "--max-restarts=1", *script(w)],
        env={"TABLE_FAIL": "1:3"}, attempts=(0, 1)),
    Row("c10d-quoted-rdzv-conf-env-init", lambda w: [*c10d(w), "--nproc-per-node=2",
                                                     "--rdzv-conf='join_timeout=30,last_call_timeout=1,timeout=30'",
                                                     *script(w)], env={"TABLE_INIT": "env"}),
    # No restart here: torchrun's restarted attempt at a fixed port may read the dead attempt's addresses from the
    # agents' store (pytorch#135712) and fail, or not, by timing. mbr-launch clears them; test_fixed_master_port
    # runs both init methods through a restart.
    Row("static-master-tcp-init", lambda w: ["--master-addr=127.0.0.1", f"--master-port={w.port}",
                                             "--nproc-per-node=2", *script(w)],
        env={"TABLE_INIT": "tcp"}, explicit_port=True),
    Row("no-python", lambda w: ["--no-python", "--nproc-per-node=2", sys.executable, str(PROBE), "first"]),
    Row("module", lambda w: ["--module", "--nproc-per-node=2", "table_probe", "first"]),
    Row("run-path", lambda w: ["--run-path", "--nproc-per-node=2", str(PROBE), "first"]),
    Row("log-line-prefix-template-pet-variables", lambda w: ["--tee=3", *script(w)],
        env={"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "<${role_name}|${rank}|${local_rank}>",
             "PET_NPROC_PER_NODE": "2", "PET_NNODES": "1", "PET_MAX_RESTARTS": "0"},
        prefix="<default|0|0>"),
    Row("elastic-two-agents", lambda w: [*c10d(w, "1:2"), "--nproc-per-node=1",
                                         "--rdzv-conf=last_call_timeout=5", *script(w)], agents=2),
    Row("worker-fails", lambda w: ["--nproc-per-node=2", *script(w)], env={"TABLE_FAIL": "1:3"},
        outcome="failed"),
    # On purpose: mbr-launch's preflight names the missing script and starts nothing (exit 2); torchrun starts
    # the workers, which fail (exit 1).
    Row("missing-script", lambda w: ["--nproc-per-node=1", str(w.cwd / "no_such_script.py")], outcome="failed",
        ours="refused"),
]


def _run(launcher: list[str], row: Row, w: Where) -> tuple[int, str, str]:
    w.out.mkdir()
    env = launcher_env(TABLE_OUT=str(w.out), **row.env)
    env.pop("PET_MASTER_PORT", None)  # rows that want a port say so; the table runs both launchers at once
    procs = [subprocess.Popen([*launcher, *row.args(w)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env, cwd=w.cwd, start_new_session=True) for _ in range(row.agents)]
    results = [finish(p, 180) for p in procs]
    worst = next((p.returncode for p in procs if p.returncode != 0), 0)
    return worst, "".join(r[0] for r in results), "".join(r[1] for r in results)


def _outcome(code: int, w: Where) -> str:
    if code == 0:
        return "ok"
    return "refused" if code == 2 and not any(w.out.iterdir()) else "failed"


def _records(out: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("*.json"))}


def _lines_in_files(logs: Path) -> set[str]:
    found = set()
    for path in logs.rglob("*"):
        if path.is_file():
            found |= {line.strip() for line in path.read_text(errors="replace").splitlines()
                      if line.strip().startswith("probe ")}
    return found


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.id)
def test_torchrun_command_line_runs_the_same_under_mbr_launch(tmp_path, row):
    sides = {}
    for name in ("torchrun", "mbr-launch"):
        cwd = tmp_path / name
        cwd.mkdir()
        shutil.copy(PROBE, cwd / "table_probe.py")  # for --module
        sides[name] = Where(free_port(), cwd / "out", cwd / "logs", cwd)
    with ThreadPoolExecutor(2) as pool:
        runs = dict(zip(sides, pool.map(lambda item: _run(item[0], row, item[1]),
                                        [(TORCHRUN, sides["torchrun"]), (MBR, sides["mbr-launch"])])))
    (t_code, t_out, t_err), (m_code, m_out, m_err) = runs["torchrun"], runs["mbr-launch"]
    t, m = sides["torchrun"], sides["mbr-launch"]
    what = f"torchrun exit {t_code}, mbr-launch exit {m_code}\nmbr-launch stderr:\n{m_err[-3000:]}\n" \
           f"torchrun stderr:\n{t_err[-3000:]}"
    assert _outcome(t_code, t) == row.outcome, what  # the row says what torchrun does: checked, not assumed
    assert _outcome(m_code, m) == (row.ours or row.outcome), what
    if (row.ours or row.outcome) == "refused":
        assert "Traceback" not in m_err and len([line for line in m_err.splitlines() if line.strip()]) <= 3, m_err
        return
    theirs, ours = _records(t.out), _records(m.out)
    assert sorted(theirs) == sorted(ours), what
    if row.outcome == "ok":
        ranks = {key.split(".")[0] for key in theirs}
        assert {key.split(".")[1] for key in theirs} == {str(a) for a in row.attempts}, sorted(theirs)
        assert len(ranks) >= 1
    for key in theirs:
        t_env, m_env = theirs[key]["env"], ours[key]["env"]
        differ = {k for k in t_env if t_env[k] != m_env[k]}
        if not row.explicit_port:
            differ.discard("MASTER_PORT")  # on purpose: a fresh port per round (docs/torchrun.md)
        else:
            assert t_env["MASTER_PORT"] == str(t.port) and m_env["MASTER_PORT"] == str(m.port), (t_env, m_env)
            differ.discard("MASTER_PORT")  # each launcher's own explicit port
        assert not differ, {k: (t_env[k], m_env[k]) for k in differ}
        assert theirs[key]["argv"] == ours[key]["argv"] and theirs[key]["name"] == ours[key]["name"], key
        assert theirs[key].get("sum") == ours[key].get("sum"), key
    if row.redirected:
        expected = {f"probe {stream} rank {r}" for r in {k.split('.')[0] for k in theirs} for stream in ("out", "err")}
        assert expected <= _lines_in_files(t.logs), sorted(_lines_in_files(t.logs))
        assert expected <= _lines_in_files(m.logs), sorted(_lines_in_files(m.logs))
    if row.prefix:
        for console in (t_out + t_err, m_out + m_err):
            assert f"{row.prefix}probe out rank 0" in console.splitlines(), console[-2000:]
