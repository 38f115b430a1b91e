"""NUMA binding of the workers (and their standbys), as ft_launcher 0.6/0.7 does it with ``NVRX_GPUS_PER_NUMA``.

What it does and says is in docs/node-checks.md ("NUMA binding"). What NVRx would crash on binds nothing here
and says so in one line. ``plan`` is pure: the value, ``numactl``'s path and the host's nodes come in.
"""

from __future__ import annotations

import functools
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Sequence

if TYPE_CHECKING:
    from mbr_launch.config.model import LaunchConfig

ENV = "NVRX_GPUS_PER_NUMA"
NODES_ONLINE = "/sys/devices/system/node/online"


@dataclass(frozen=True)
class NumaPlan:
    prefixes: Mapping[int, tuple[str, ...]] = field(default_factory=dict)  # local rank -> numactl + options
    line: str | None = None  # what to say at launch: the binding, or why there is none

    def wrap(self, local_rank: int, argv: Sequence[str]) -> list[str]:
        return [*self.prefixes.get(local_rank, ()), *argv]


def parse_nodes(text: str) -> set[int]:
    """A sysfs node list ("0", "0-1,4") -> {0, 1, 4}."""
    nodes: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        nodes.update(range(int(low), int(high or low) + 1))
    return nodes


def plan(value: str | None, *, nproc_per_node: int, strict: bool, numactl: str | None,
         nodes: set[int] | None) -> NumaPlan:
    """The binding of each local rank for ``NVRX_GPUS_PER_NUMA=value``; ``nodes`` None: not checked."""
    if value is None:
        return NumaPlan()
    why_not = f"{ENV}={value!r} asks for NUMA binding, but "
    try:
        per_node = int(value)
    except ValueError:
        per_node = 0
    if per_node <= 0:
        return NumaPlan(line=f"WARNING: {why_not}it is not a positive whole number: workers are not NUMA-bound")
    if numactl is None:
        return NumaPlan(line=f"WARNING: {why_not}numactl is not installed (apt-get install numactl): workers "
                             "are not NUMA-bound")
    wanted = {rank: rank // per_node for rank in range(nproc_per_node)}
    missing = sorted({n for n in wanted.values() if nodes is not None and n not in nodes})
    if missing:
        have = ",".join(map(str, sorted(nodes or ()))) or "none"
        return NumaPlan(line=f"WARNING: {why_not}{nproc_per_node} local ranks need NUMA node(s) "
                             f"{','.join(map(str, missing))}, which this host does not have (it has {have}): "
                             "workers are not NUMA-bound")
    memory = ("--membind={}",) if strict else ("--localalloc",)
    prefixes = {rank: (numactl, f"--cpunodebind={node}", *(m.format(node) for m in memory))
                for rank, node in wanted.items()}
    spans = []
    for node in sorted(set(wanted.values())):
        ranks = [r for r, n in wanted.items() if n == node]
        spans.append(f"{ranks[0]}-{ranks[-1]} on node {node}" if len(ranks) > 1 else f"{ranks[0]} on node {node}")
    mode = "--membind" if strict else "--localalloc (--ft-numa-bind-strict false)"
    ranks = "local rank" if nproc_per_node == 1 else "local ranks"
    return NumaPlan(prefixes=prefixes, line=f"NUMA binding ({ENV}={per_node}, numactl --cpunodebind {mode}): "
                                            f"{ranks} {', '.join(spans)}")


@functools.lru_cache(maxsize=8)
def _cached(value: str | None, nproc_per_node: int, strict: bool, path: str | None) -> NumaPlan:
    if value is None:
        return NumaPlan()
    try:
        nodes: set[int] | None = parse_nodes(Path(NODES_ONLINE).read_text())
    except (OSError, ValueError):
        nodes = None
    return plan(value, nproc_per_node=nproc_per_node, strict=strict, numactl=shutil.which("numactl", path=path),
                nodes=nodes)


def for_launch(environ: Mapping[str, str], *, nproc_per_node: int, strict: bool) -> NumaPlan:
    """The plan for this launch (looked up once: every worker and standby start asks)."""
    return _cached(environ.get(ENV), nproc_per_node, strict, environ.get("PATH"))


def worker_argv(cfg: "LaunchConfig", environ: Mapping[str, str], local_rank: int) -> list[str]:
    """One worker's command line, through numactl where the launch binds it."""
    numa = for_launch(environ, nproc_per_node=cfg.workers.nproc_per_node, strict=cfg.nvrx.numa_bind_strict)
    return numa.wrap(local_rank, cfg.workers.argv(local_rank))
