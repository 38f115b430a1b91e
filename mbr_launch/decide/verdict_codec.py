"""Hang evidence and verdicts as plain dicts for the rendezvous store, and back. Pure: dicts in, dicts out.

Decoding never raises: the dict came from another node, so an invalid field falls back to its default and an
unreadable entry is skipped."""

from __future__ import annotations

import enum
from typing import Any, Callable, Mapping, TypeVar

from mbr_launch import outside
from mbr_launch.decide.verdict import Basis, GroupProgress, ProcState, RankEvidence, StackClass, Verdict
from mbr_launch.decide.verdict_text import compress_ranks


def evidence_to_dict(e: RankEvidence) -> dict[str, Any]:
    out = {f: getattr(e, f) for f in _EVIDENCE_PLAIN}
    out.update(state=e.state.value, stack=e.stack.value, progress=[
        {"pg": g.pg, "enqueued": g.enqueued, "started": g.started, "completed": g.completed,
         "ranks": list(g.ranks), "last_op": g.last_op} for g in e.progress])
    return out


def evidence_from_dict(d: object) -> RankEvidence | None:
    """None when the entry is unreadable (not a dict, or no rank); other invalid fields take their default."""
    if not isinstance(d, Mapping) or _int(d.get("rank")) is None or d["rank"] < 0:
        return None
    progress = tuple(g for g in map(_progress_from_dict, _list(d.get("progress"))) if g is not None)
    return RankEvidence(
        rank=d["rank"], node=_str(d.get("node")), group_rank=_int(d.get("group_rank"), -1),
        local_rank=_int(d.get("local_rank"), -1), pid=_int(d.get("pid")),
        state=_enum(ProcState, d.get("state"), ProcState.UNKNOWN), cpu=outside.finite(d.get("cpu")),
        stack=_enum(StackClass, d.get("stack"), StackClass.NONE), where=_str(d.get("where")),
        collective=_str(d.get("collective")), progress=progress, expired=d.get("expired") is True,
        watched=d.get("watched") is True,
        kind=_str(d.get("kind")), section=_str(d.get("section"), None),
        last_heartbeat_age=outside.finite(d.get("last_heartbeat_age")), steps=_int(d.get("steps")),
        stacks_path=_str(d.get("stacks_path"), None))


def evidence_list_from_dicts(items: object) -> tuple[RankEvidence, ...]:
    return tuple(e for e in map(evidence_from_dict, _list(items)) if e is not None)


def verdict_to_wire(v: Verdict) -> dict[str, Any]:
    """The verdict as the other nodes read it: the culprits' evidence only and the waiting ranks as ranges,
    about a kilobyte at any size (every rank's evidence, read by every node, is O(nodes x ranks))."""
    culprits = set(v.culprits)
    return {"culprits": list(v.culprits), "basis": v.basis.value, "reason": v.reason,
            "waiting": compress_ranks(v.waiting),
            "evidence": [evidence_to_dict(e) for e in v.evidence if e.rank in culprits]}


# Verdicts that name no culprit by design: culprits sent with one are dropped, never acted on.
_BLAMELESS = (Basis.UNDETERMINED, Basis.WITHDRAWN, Basis.JOB_STALL)


def verdict_from_dict(d: object) -> Verdict | None:
    """None when not a dict. An unknown basis makes the verdict undetermined: no culprit without a rule."""
    if not isinstance(d, Mapping):
        return None
    basis = _enum(Basis, d.get("basis"), Basis.UNDETERMINED)
    blameless = basis in _BLAMELESS
    culprits = () if blameless else _ranks(d.get("culprits"))
    kept = culprits or blameless
    waiting = d.get("waiting")
    return Verdict(culprits, basis if kept else Basis.UNDETERMINED, _str(d.get("reason")),
                   _rank_ranges(waiting) if isinstance(waiting, str) else _ranks(waiting),
                   evidence_list_from_dicts(d.get("evidence")))


_EVIDENCE_PLAIN = ("rank", "node", "group_rank", "local_rank", "pid", "cpu", "where", "collective", "expired",
                   "watched", "kind", "section", "last_heartbeat_age", "steps", "stacks_path")
_E = TypeVar("_E", bound=enum.Enum)
_D = TypeVar("_D")


def _progress_from_dict(d: object) -> GroupProgress | None:
    if not isinstance(d, Mapping) or not isinstance(d.get("pg"), str):
        return None
    return GroupProgress(pg=d["pg"], enqueued=_int(d.get("enqueued"), -1), started=_int(d.get("started"), -1),
                         completed=_int(d.get("completed"), -1), ranks=_ranks(d.get("ranks")),
                         last_op=_str(d.get("last_op")))


def _int(v: object, default: _D = None) -> int | _D:  # type: ignore[assignment]
    got = outside.integer(v)
    return default if got is None else got


# Characters of one string field kept: another node's strings reach every node's console and events.jsonl.
MAX_TEXT = 2000


def _str(v: object, default: _D = "") -> str | _D:  # type: ignore[assignment]
    """A string field from another node: one line, control characters shown, bounded."""
    return outside.text(v, default, MAX_TEXT)


def _list(v: object) -> list[Any]:
    return v if isinstance(v, list) else []


def _ranks(v: object) -> tuple[int, ...]:
    return tuple(r for r in _list(v) if _int(r) is not None and r >= 0)


# The most ranks a "0-16,18" list expands to: a job's ranks, with room; a forged "0-99999999999" stops here.
MAX_RANKS = 1 << 20


def _rank_ranges(text: str) -> tuple[int, ...]:
    """``"0-16,18"`` (``compress_ranks``) -> the ranks; unreadable parts are skipped, the total is bounded."""
    out: list[int] = []
    for part in text.split(",")[:MAX_RANKS]:
        first, dash, last = part.partition("-")
        if not (first.isdigit() and (last.isdigit() or not dash)) or len(first) > 7 or len(last) > 7:
            continue
        low, high = int(first), int(last or first)
        out.extend(range(low, min(high, low + MAX_RANKS - len(out) - 1) + 1))
        if len(out) >= MAX_RANKS:
            break
    return tuple(out)


def _enum(cls: Callable[[Any], _E], v: object, default: _E) -> _E:
    try:
        return cls(v)
    except (ValueError, TypeError):
        return default
