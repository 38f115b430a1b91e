"""The Slurm environment as a typed adapter over a table of variables.

Pure: reads a mapping, runs no commands, so every behaviour is testable from a dict. The launcher asks
``SlurmEnv`` only for the values the user left at their defaults. The Slurm facts it relies on are listed in
docs/slurm.md, "What mbr-launch reads from Slurm"."""

from __future__ import annotations

import itertools
import math
import re
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar


# A typo like n[0-999999999] must fail fast instead of building a billion names.
_MAX_HOSTS = 1 << 20

_T = TypeVar("_T")


class SlurmError(Exception):
    """The Slurm environment is malformed or unusable; the message names the bad input and the fix."""


# ---- node lists -----------------------------------------------------------------------------------


def _split_top_level(s: str) -> list[str]:
    tokens: list[str] = []
    depth = 0
    cur: list[str] = []
    for ch in s:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if depth == 0 and (ch == "," or ch.isspace()):
            tokens.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    tokens.append("".join(cur))
    return [t for t in tokens if t]  # Slurm skips empty tokens: "n1,,n2" and "n[1-2]," are fine


def _expand_ranges(body: str, whole: str) -> list[str]:
    """``01-03,07`` -> ``["01", "02", "03", "07"]``; the width of the low end sets the zero padding."""
    out: list[str] = []
    for part in body.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:-(\d+))?\s*", part)
        if not m:
            raise SlurmError(f"invalid range {part!r} in node list {whole!r}: expected N or N-M")
        lo_s, hi_s = m.group(1), m.group(2) or m.group(1)
        lo, hi = int(lo_s), int(hi_s)
        if lo > hi:
            raise SlurmError(f"invalid range {part!r} in node list {whole!r}: {lo} > {hi}")
        if hi - lo + 1 + len(out) > _MAX_HOSTS:
            raise SlurmError(f"node list {whole!r} expands to more than {_MAX_HOSTS} hosts")
        out.extend(f"{i:0{len(lo_s)}d}" for i in range(lo, hi + 1))
    return out


def _expand_token(tok: str, whole: str) -> list[str]:
    # "a[1-2]-b[3-4]" -> literals ["a", "-b", ""] and groups ["1-2", "3-4"]
    pieces = re.split(r"\[([^\[\]]*)\]", tok)
    literals, groups = pieces[0::2], pieces[1::2]
    if any("[" in lit or "]" in lit for lit in literals):
        raise SlurmError(f"unbalanced brackets in {tok!r} of node list {whole!r}")
    if groups and literals[-1]:
        # Slurm rejects text after the last bracket group ("n[1-2]x"): so do we, to agree with it.
        raise SlurmError(f"text {literals[-1]!r} after the last ']' in {tok!r} of node list {whole!r}")
    if not groups:
        return [tok]
    values = [_expand_ranges(g, whole) for g in groups]
    if math.prod(len(v) for v in values) > _MAX_HOSTS:
        raise SlurmError(f"node list {whole!r} expands to more than {_MAX_HOSTS} hosts")
    # Slurm's order (hostlist.c _push_range_list): the last group varies fastest; the other groups
    # nest from the second-to-last (outermost) down to the first. For two groups that is plain
    # row-major order; for a[1-2]b[1-2]c[1-2] it is a1b1c1 a1b1c2 a2b1c1 a2b1c2 a1b2c1 ...
    order = [*range(len(groups) - 2, -1, -1), len(groups) - 1]
    chosen = (dict(zip(order, combo)) for combo in itertools.product(*(values[g] for g in order)))
    return ["".join(lit + picked.get(i, "") for i, lit in enumerate(literals)) for picked in chosen]


def parse_nodelist(s: str) -> list[str]:
    """Expand a Slurm node list (``gpu-a[01-03,07],gpu-b12``) into host names, in Slurm's order: as
    ``scontrol show hostnames`` on well-formed input; malformed input, which scontrol guesses at, raises."""
    if not s or not s.strip():
        raise SlurmError(f"empty node list {s!r}: expected something like 'n[1-4]' or 'gpu01,gpu02'")
    if s.count("[") != s.count("]"):
        raise SlurmError(f"unbalanced brackets in node list {s!r}")
    hosts: list[str] = []
    for tok in _split_top_level(s.strip()):
        hosts.extend(_expand_token(tok, s))
        if len(hosts) > _MAX_HOSTS:
            raise SlurmError(f"node list {s!r} expands to more than {_MAX_HOSTS} hosts")
    if not hosts:
        raise SlurmError(f"node list {s!r} names no hosts")
    return hosts


def parse_tasks_per_node(s: str) -> list[int]:
    """Expand Slurm's compressed count list: ``2(x3),1`` -> ``[2, 2, 2, 1]`` (one entry per node)."""
    counts: list[int] = []
    for part in s.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:\(\s*x\s*(\d+)\s*\))?\s*", part)
        if not m or (m.group(2) is not None and int(m.group(2)) == 0):
            raise SlurmError(f"invalid tasks-per-node list {s!r}: expected e.g. '2(x3),1', got part {part!r}")
        counts.extend([int(m.group(1))] * int(m.group(2) or 1))
        if len(counts) > _MAX_HOSTS:
            raise SlurmError(f"tasks-per-node list {s!r} covers more than {_MAX_HOSTS} nodes")
    return counts


# ---- the variable table ---------------------------------------------------------------------------

# Each field reads the first variable that is set, in this order. A launcher runs inside an srun step,
# so the step's own values come before the job's (the two differ for `srun -N1` in a 4-node job).
_VARS: dict[str, tuple[str, ...]] = {
    "job_id": ("SLURM_JOB_ID", "SLURM_JOBID"),
    "step_id": ("SLURM_STEP_ID", "SLURM_STEPID"),
    "job_name": ("SLURM_JOB_NAME",),
    "nodelist": ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"),
    "num_nodes": ("SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"),
    "node_id": ("SLURM_NODEID",),
    "proc_id": ("SLURM_PROCID",),
    "tasks_per_node": ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"),
    "ntasks": ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"),
    "restart_count": ("SLURM_RESTART_COUNT",),
    "hostname": ("SLURMD_NODENAME",),
    "kill_on_bad_exit": ("SLURM_KILL_BAD_EXIT",),
}


def _lookup(env: Mapping[str, str], field: str) -> tuple[str, str] | None:
    for name in _VARS[field]:
        value = env.get(name)
        if value is not None and value.strip() != "":
            return name, value.strip()
    return None


def _read(env: Mapping[str, str], field: str, parse: Callable[[str], _T]) -> _T | None:
    found = _lookup(env, field)
    if found is None:
        return None
    name, value = found
    try:
        return parse(value)
    except SlurmError as e:
        raise SlurmError(f"{name}={value!r}: {e}") from None
    except ValueError:
        raise SlurmError(f"{name}={value!r} is not valid; unset it or fix the job script") from None


def _nonneg_int(value: str) -> int:
    n = int(value)
    if n < 0:
        raise ValueError(value)
    return n


@dataclass(frozen=True)
class SlurmEnv:
    """What Slurm tells this process about its job and step."""

    job_id: str
    step_id: str | None  # None in the batch script and in an salloc shell: not inside an srun step
    job_name: str | None
    nodelist: tuple[str, ...]  # the step's nodes when in a step, else the job's
    num_nodes: int
    node_id: int | None
    proc_id: int | None
    tasks_per_node: tuple[int, ...]  # one entry per node of `nodelist`; empty when Slurm did not say
    ntasks: int | None
    restart_count: int
    hostname: str | None
    kill_on_bad_exit: bool | None  # None: not discoverable from the environment

    @property
    def in_step(self) -> bool:
        return self.step_id is not None

    @classmethod
    def from_environ(cls, env: Mapping[str, str]) -> SlurmEnv | None:
        found = _lookup(env, "job_id")
        if found is None:
            return None
        job_id = found[1]
        nodes = _read(env, "nodelist", parse_nodelist)
        num_nodes = _read(env, "num_nodes", _nonneg_int)
        if nodes is None:
            # Every real job sets SLURM_JOB_NODELIST; without it we cannot pick a rendezvous host.
            raise SlurmError(f"SLURM_JOB_ID={job_id!r} is set but SLURM_JOB_NODELIST/SLURM_STEP_NODELIST are not; "
                             "unset SLURM_JOB_ID if this is not a Slurm job, or pass --nnodes and --rdzv-endpoint")
        if num_nodes is None:
            num_nodes = len(nodes)
        elif num_nodes != len(nodes):
            raise SlurmError(f"Slurm says {num_nodes} nodes but the node list {nodes!r} has {len(nodes)}; "
                             "pass --nnodes and --rdzv-endpoint explicitly")
        tasks = tuple(_read(env, "tasks_per_node", parse_tasks_per_node) or ())
        if tasks and len(tasks) != len(nodes):
            raise SlurmError(f"tasks-per-node {tasks!r} does not cover the {len(nodes)} nodes {list(nodes)!r}; "
                             "pass --nnodes and --node-rank explicitly")
        node_id = _read(env, "node_id", _nonneg_int)
        if node_id is not None and node_id >= len(nodes):
            raise SlurmError(f"SLURM_NODEID={node_id} is outside the node list {list(nodes)!r}")
        return cls(
            job_id=job_id, step_id=_read(env, "step_id", str), job_name=_read(env, "job_name", str),
            nodelist=tuple(nodes), num_nodes=num_nodes, node_id=node_id, proc_id=_read(env, "proc_id", _nonneg_int),
            tasks_per_node=tasks, ntasks=_read(env, "ntasks", _nonneg_int),
            restart_count=_read(env, "restart_count", _nonneg_int) or 0, hostname=_read(env, "hostname", str),
            kill_on_bad_exit=_read(env, "kill_on_bad_exit", lambda value: int(value) != 0),  # srun's reading
        )

    # ---- derivations the launcher uses for values the user left at default -------------------------

    def nnodes(self) -> int:
        return self.num_nodes

    def node_rank(self) -> int:
        if self.node_id is None:
            raise SlurmError("SLURM_NODEID is not set: run mbr-launch under srun, or pass --node-rank")
        return self.node_id

    def rdzv_endpoint(self, port: int) -> str:
        """The step's first node hosts the rendezvous store: every node computes the same name."""
        if not 0 < port < 65536:
            raise SlurmError(f"rendezvous port {port} is outside 1..65535")
        return f"{self.nodelist[0]}:{port}"

    def rdzv_port(self) -> int:
        """A port in 20000..39999 every node computes alike, different for other jobs, steps and requeues."""
        key = f"{self.job_id}.{self.step_id}.{self.restart_count}".encode()
        return 20000 + zlib.crc32(key) % 20000

    def run_id(self) -> str:
        """Unique per job, step and requeue (a requeue keeps the job id), and equal on every node of one step, so a
        requeued job never joins rendezvous state left by its previous life."""
        step = self.step_id if self.step_id is not None else "batch"
        return f"slurm-{self.job_id}-{step}-r{self.restart_count}"

    def tasks_on_this_node(self) -> int | None:
        if not self.tasks_per_node or self.node_id is None:
            return None
        return self.tasks_per_node[self.node_id]

    def _this_node(self) -> str:
        if self.hostname:
            return self.hostname
        if self.node_id is not None:
            return self.nodelist[self.node_id]
        return "this node"

    def check_one_launcher_per_node(self) -> str | None:
        if not self.in_step:
            if self.num_nodes > 1:
                # A batch script (or salloc shell) runs once: the other nodes would never join.
                return (f"mbr-launch is running outside an srun step (in the batch script or salloc shell) of a "
                        f"{self.num_nodes}-node job, so only {self._this_node()} runs it; start it on every node "
                        "with `srun --ntasks-per-node=1 --ntasks=$SLURM_NNODES mbr-launch ...`")
            return None
        n = self.tasks_on_this_node()
        if n is not None and n > 1:
            return (f"mbr-launch must run once per node: this step runs {n} tasks on node {self._this_node()}; "
                    "use `srun --ntasks-per-node=1 --ntasks=$SLURM_NNODES mbr-launch ...` (inside an sbatch job "
                    "with --ntasks-per-node>1, srun inherits SLURM_NTASKS and ignores --ntasks-per-node=1 "
                    "unless --ntasks is given too); mbr-launch starts one worker per GPU itself (--nproc-per-node)")
        return None

    def kill_on_bad_exit_warning(self) -> str | None:
        if self.kill_on_bad_exit:
            return ("SLURM_KILL_BAD_EXIT=1: when mbr-launch on one node exits with an error (for example after "
                    "its node is excluded), srun kills the launchers on all other nodes, so the job cannot carry "
                    "on without that node; use `srun --kill-on-bad-exit=0` to let mbr-launch decide")
        return None
