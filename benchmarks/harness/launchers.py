"""Who is launched how: the launcher table (mbr-launch, torchrun, ft_launcher, yardsticks), the worker's
command line, and which mbr_launch code the launched mbr-launch imports."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Mapping, Sequence

from testkit.helpers import free_port

from .machine import run_quiet
from .paths import BIN, COLLECTIVE, REPO


@dataclass(frozen=True)
class LaunchSpec:
    """What one launch runs: nproc ranks of ``worker`` (argv after the interpreter), logs under log_dir."""
    nproc: int
    max_restarts: int
    worker: list[str]
    log_dir: Path


@dataclass(frozen=True)
class Launcher:
    name: str
    argv: Callable[[LaunchSpec], list[str]]
    env: dict[str, str] = field(default_factory=dict)
    reference: bool = False  # a yardstick (no launcher), left out of ratios
    note: str = ""


def tool(name: str) -> str:
    """A launcher's executable: the one next to this interpreter (the venv's), else the one on PATH."""
    path = BIN / name
    return str(path) if path.exists() else (shutil.which(name) or name)


def _mbr(s: LaunchSpec) -> list[str]:
    return [tool("mbr-launch"), "--standalone", "--nproc-per-node", str(s.nproc), "--max-restarts",
            str(s.max_restarts), "--log-dir", str(s.log_dir), *s.worker]


def _torchrun(s: LaunchSpec) -> list[str]:
    return [tool("torchrun"), "--standalone", "--nproc-per-node", str(s.nproc), "--max-restarts",
            str(s.max_restarts), *s.worker]


def _ft(s: LaunchSpec) -> list[str]:
    # Heartbeat timeouts far beyond a trial: the workers use no NVRx client, and we measure crashes only.
    return [tool("ft_launcher"), "--standalone", "--nproc-per-node", str(s.nproc), "--max-restarts",
            str(s.max_restarts), "--ft-initial-rank-heartbeat-timeout", "600", "--ft-rank-heartbeat-timeout",
            "600", *s.worker]


def _bare(s: LaunchSpec) -> list[str]:
    """The ranks started directly by sh with torchrun's variables: the floor for any launcher."""
    port = free_port()
    quoted = " ".join(shlex.quote(a) for a in s.worker)
    starts = "; ".join(
        f"RANK={r} LOCAL_RANK={r} GROUP_RANK=0 {sys.executable} -u {quoted} & p{r}=$!" for r in range(s.nproc))
    waits = "; ".join(f"wait $p{r} || rc=1" for r in range(s.nproc))
    script = (f"export WORLD_SIZE={s.nproc} LOCAL_WORLD_SIZE={s.nproc} MASTER_ADDR=127.0.0.1 "
              f"MASTER_PORT={port} TORCHELASTIC_RESTART_COUNT=0 OMP_NUM_THREADS=1; rc=0; {starts}; {waits}; "
              "exit $rc")
    return ["/bin/sh", "-c", script]


def _import_torch(_s: LaunchSpec) -> list[str]:
    return [sys.executable, "-c", "import torch"]


LAUNCHERS: dict[str, Launcher] = {
    "mbr-launch": Launcher("mbr-launch", _mbr),
    "mbr-launch-dynamo": Launcher("mbr-launch-dynamo", lambda s: [*_mbr(s)[:1], "--standby-preload", "torch._dynamo",
                                                                    *_mbr(s)[1:]],
                                  note="--standby-preload torch._dynamo"),
    "torchrun": Launcher("torchrun", _torchrun, note="default: workers share the rendezvous TCPStore"),
    "torchrun-noshare": Launcher("torchrun-noshare", _torchrun, env={"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"},
                                 note="TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"),
    "ft_launcher": Launcher("ft_launcher", _ft, note="--ft-*-heartbeat-timeout 600"),
    "bare": Launcher("bare", _bare, reference=True, note="ranks started by sh, no launcher"),
    "import-torch": Launcher("import-torch", _import_torch, reference=True, note='python -c "import torch"'),
}
BASELINE, TORCHRUN = "ft_launcher", "torchrun"


def variant_names(spec: str, variants: Mapping, choices: Sequence[str]) -> list[str]:
    """``--launchers a,b`` checked against a bench's own variants; a clear exit on an unknown name."""
    names = [n.strip() for n in spec.split(",") if n.strip()]
    bad = [n for n in names if n not in variants]
    if bad or not names:
        raise SystemExit(f"--launchers: unknown {bad or 'empty list'}; choose from {', '.join(choices)}")
    return names


def pick_launchers(text: str, allowed: Sequence[str], *, mbr_path: Path | None = None) -> list[Launcher]:
    """The named launchers; with mbr_path, mbr-launch (agent, monitor, worker shim) imports mbr_launch there."""
    chosen = [LAUNCHERS[n] for n in variant_names(text, allowed, allowed)]
    return [with_mbr_path(l, mbr_path) for l in chosen]


def with_mbr_path(launcher: Launcher, mbr_path: Path | None) -> Launcher:
    """The launcher with mbr_env(mbr_path) added when it is an mbr-launch variant (its name says so)."""
    if mbr_path is None or not launcher.name.startswith("mbr-"):
        return launcher
    return replace(launcher, env={**launcher.env, **mbr_env(mbr_path)})


def mbr_env(mbr_path: Path | None) -> dict[str, str]:
    """The environment that makes mbr-launch (agent, monitor, worker shim) import mbr_launch from mbr_path
    (a --mbr-source snapshot); empty when the installed code runs."""
    if mbr_path is None:
        return {}
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(mbr_path), os.environ.get("PYTHONPATH", "")) if p)}


def snapshot(rev: str, dest: Path) -> Path:
    """``git archive REV mbr_launch`` unpacked (and byte-compiled) into ``dest``: code that nobody edits while a
    bench runs."""
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", rev, "mbr_launch"], cwd=REPO, capture_output=True, timeout=60,
                             check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True, timeout=60)
    # Byte-compile now, or the first trial pays for it (the live tree's __pycache__ is warm already).
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(dest)], check=True, timeout=120)
    return dest


def baseline_variant(launcher: Launcher, path: Path, rev: str) -> Launcher:
    """``launcher`` (an mbr-launch variant) running the mbr_launch code of ``rev`` (see ``snapshot``), named
    ``NAME@REV``. Started as ``python -m mbr_launch``: the console script of this checkout names the entry
    point of today's layout, which an older revision may not have."""
    def argv(s: LaunchSpec) -> list[str]:
        return [sys.executable, "-m", "mbr_launch", *launcher.argv(s)[1:]]
    return Launcher(f"{launcher.name}@{rev}", argv, env={**launcher.env, **mbr_env(path)},
                    note=f"{launcher.note + '; ' if launcher.note else ''}mbr_launch of {rev}")


def mbr_source(which: str, root: Path) -> tuple[Path | None, str]:
    """Which mbr_launch code runs: 'head' = a `git archive HEAD` snapshot (other people edit the tree while
    a bench runs), 'tree' = the working tree as it is. Returns (path for PYTHONPATH or None, description)."""
    commit = run_quiet(["git", "rev-parse", "--short", "HEAD"]) or "?"
    if which == "tree":
        dirty = bool(run_quiet(["git", "status", "--porcelain", "--", "mbr_launch"]))
        return None, f"working tree at {commit}" + (" with uncommitted changes" if dirty else "")
    return snapshot("HEAD", root / "mbr-src"), f"commit {commit} (git archive HEAD snapshot, PYTHONPATH)"


def worker_argv(ready_file: Path, *, hold: float, gpu: bool, steps: int = 3) -> list[str]:
    argv = [str(COLLECTIVE), "--ready-file", str(ready_file), "--hold", str(hold), "--steps", str(steps)]
    return [*argv, "--gpu"] if gpu else argv
