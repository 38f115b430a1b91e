"""Words for the hang verdict: rank lists, who is where, which collective. Pure; plain values in, text out."""

from __future__ import annotations

from typing import Iterable, Sequence


def consecutive_runs(values: Sequence[int]) -> list[tuple[int, int]]:
    """``[0, 1, 2, 5, 6, 9]`` -> ``[(0, 2), (5, 6), (9, 9)]``."""
    runs: list[tuple[int, int]] = []
    for v in values:
        if runs and v == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], v)
        else:
            runs.append((v, v))
    return runs


def compress_ranks(ranks: Iterable[int]) -> str:
    """``[0, 1, 2, 3, 4, 6, 7]`` -> ``"0-4,6,7"`` (a run of two stays listed: "6-7" reads like a subtraction)."""
    parts: list[str] = []
    for first, last in consecutive_runs(sorted(set(ranks))):
        if last - first >= 2:
            parts.append(f"{first}-{last}")
        else:
            parts.extend(str(v) for v in range(first, last + 1))
    return ",".join(parts)


def ranks_phrase(ranks: Iterable[int]) -> str:
    """``"rank 3"`` or ``"ranks 0-2"``."""
    values = sorted(set(ranks))
    return f"{'rank' if len(values) == 1 else 'ranks'} {compress_ranks(values)}"


def verb(count: int, one: str, many: str) -> str:
    return one if count == 1 else many


def who(rank: int, node: str) -> str:
    """``"rank 5 on n2"``: a node is what gets excluded."""
    return f"rank {rank} on {node}" if node else f"rank {rank}"


def op_name(name: str) -> str:
    """Flight Recorder's profiling names carry the backend ("gloo:all_reduce", "nccl:all_reduce")."""
    return name.split(":", 1)[1] if ":" in name else name


def collective_phrase(op: str, seq: int, pg: str) -> str:
    """``"all_reduce #183 of process group 0"``."""
    return f"{op_name(op) or 'collective'} #{seq} of process group {pg}"


def count_phrase(n: int) -> str:
    """Flight Recorder's sequence numbers start at 1 (-1: none yet), so the last one is also the count."""
    if n <= 0:
        return "no collective"
    return f"{n} {verb(n, 'collective', 'collectives')}"


def place_phrase(where: str, cpu: float | None) -> str:
    """``" (in `sleep at train.py:42`)"``, with its CPU share when busy (a busy loop's stack looks like any)."""
    parts = [f"in `{where}`"] if where else []
    if cpu is not None and cpu >= 0.8:
        parts.append(f"busy at {cpu * 100:.0f}% of a CPU")
    return f" ({', '.join(parts)})" if parts else ""


def waiting_lines(described: dict[str, list[int]]) -> str:
    """``{"all_reduce #183 of process group 0": [0, 1, 2]}`` -> ``"ranks 0-2 wait in all_reduce #183 of ..."``."""
    return "; ".join(f"{ranks_phrase(ranks)} {verb(len(ranks), 'waits', 'wait')} in {what}"
                     for what, ranks in sorted(described.items(), key=lambda item: min(item[1])))
