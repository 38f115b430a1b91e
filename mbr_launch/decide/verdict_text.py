"""Words for the hang verdict: rank lists, who is where, which collective. Pure; plain values in, text out.

Kept apart from ``verdict`` so the rules read as rules; nothing here decides anything.
"""

from __future__ import annotations

from typing import Iterable


def compress_ranks(ranks: Iterable[int]) -> str:
    """``[0, 1, 2, 3, 4, 6, 7]`` -> ``"0-4,6,7"``. Runs of three or more become a range; a run of two stays
    listed ("6,7", since "6-7" saves nothing and reads like a subtraction)."""
    values = sorted(set(ranks))
    parts: list[str] = []
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        if j - i >= 2:
            parts.append(f"{values[i]}-{values[j]}")
        else:
            parts.extend(str(v) for v in values[i:j + 1])
        i = j + 1
    return ",".join(parts)


def ranks_phrase(ranks: Iterable[int]) -> str:
    """``"rank 3"`` or ``"ranks 0-2"``."""
    values = sorted(set(ranks))
    return f"{'rank' if len(values) == 1 else 'ranks'} {compress_ranks(values)}"


def verb(count: int, one: str, many: str) -> str:
    return one if count == 1 else many


def who(rank: int, node: str) -> str:
    """``"rank 5 on n2"``: the node matters as much as the rank, since a node is what gets excluded."""
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
    """``" (in `sleep at train.py:42`)"``, with how busy it is when it burns a CPU (a busy loop holding the
    GIL looks like any other frame in a stack, the CPU share tells it apart)."""
    parts = [f"in `{where}`"] if where else []
    if cpu is not None and cpu >= 0.8:
        parts.append(f"busy at {cpu * 100:.0f}% of a CPU")
    return f" ({', '.join(parts)})" if parts else ""


def waiting_lines(described: dict[str, list[int]]) -> str:
    """``{"all_reduce #183 of process group 0": [0, 1, 2]}`` -> ``"ranks 0-2 wait in all_reduce #183 of
    process group 0"``; several places are joined with "; "."""
    return "; ".join(f"{ranks_phrase(ranks)} {verb(len(ranks), 'waits', 'wait')} in {what}"
                     for what, ranks in sorted(described.items(), key=lambda item: min(item[1])))
