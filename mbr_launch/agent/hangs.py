"""What the agent does with a rank monitor's expiry verdict: describe it and dump every local rank's stacks."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

from mbr_launch.agent.context import StackRecord
from mbr_launch.agent.messages import RankExpired
from mbr_launch.contract import STACK_FILE_ENV
from mbr_launch.report.events import EventLog
from mbr_launch.workers.process import Worker
from mbr_launch.workers.stacks import StackTarget, dump_stacks

KIND_TEXT = {
    "initial_heartbeat": "sent no first heartbeat",
    "heartbeat": "sent no heartbeat",
    "section": "stayed in section '{section}'",
    "out_of_section": "stayed outside any section",
    "step": "finished no optimizer step",
}


def describe(event: RankExpired) -> str:
    text = KIND_TEXT.get(event.kind, event.kind).format(section=event.section)
    parts = [f"{text} for {event.elapsed:.2f} s (timeout {event.timeout:g} s)"
             if event.elapsed is not None and event.timeout is not None else text]
    if event.last_heartbeat_age is not None:
        parts.append(f"last heartbeat {event.last_heartbeat_age:.1f} s ago")
    if event.open_sections:
        parts.append(f"open sections: {', '.join(event.open_sections)}")
    return "; ".join(parts)


def dump_all(workers: Sequence[Worker], out_dir: Path, *, method: str, round_index: int, log: EventLog,
             say: Callable[[str], None]) -> list[StackRecord]:
    """Stacks of every live local rank (the hung one and its peers, which often show the collective)."""
    if method == "off":
        return []
    targets = [StackTarget(rank=w.rank, local_rank=w.local_rank, pid=w.pid,
                           faulthandler_file=Path(w.spec.env[STACK_FILE_ENV])
                           if STACK_FILE_ENV in w.spec.env else None)
               for w in workers if w.alive]
    try:
        dumps = dump_stacks(targets, out_dir, method=method, timeout=10.0)
    except Exception as err:  # diagnosis must never block the recovery
        say(f"stack dump failed: {err}")
        return []
    records = [StackRecord(local_rank=d.local_rank, rank=d.rank, path=str(d.path) if d.path else None,
                           method=d.method, summary=d.summary) for d in dumps]
    log.emit("stacks", round=round_index, method=sorted({r.method for r in records}), paths=[r.path for r in records])
    for r in records:
        say(f"stacks of rank {r.rank} ({r.method}): {r.path}  [{r.summary}]")
    return records
