"""What the agent does with a rank monitor's expiry verdict: describe it and dump every local rank's stacks."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mbr_launch.agent.supervisor import Agent
    from mbr_launch.cluster.rendezvous import Round

KIND_TEXT = {
    "initial_heartbeat": "sent no first heartbeat",
    "heartbeat": "sent no heartbeat",
    "section": "stayed in section '{section}'",
    "out_of_section": "stayed outside any section",
    "step": "finished no optimizer step",
}


def describe(event: dict[str, Any]) -> str:
    text = KIND_TEXT.get(str(event.get("kind")), str(event.get("kind"))).format(section=event.get("section"))
    elapsed, timeout = event.get("elapsed"), event.get("timeout")
    parts = [f"{text} for {elapsed:.2f} s (timeout {timeout:g} s)" if isinstance(elapsed, (int, float))
             and isinstance(timeout, (int, float)) else text]
    age = event.get("last_heartbeat_age")
    if isinstance(age, (int, float)):
        parts.append(f"last heartbeat {age:.1f} s ago")
    if event.get("open_sections"):
        parts.append(f"open sections: {', '.join(event['open_sections'])}")
    return "; ".join(parts)


def dump_all(agent: "Agent", rnd: "Round") -> list[dict[str, Any]]:
    """Stacks of every live local rank (the hung one and its peers, which often show the collective)."""
    cfg = agent.cfg
    if cfg.monitor.stack_dump == "off" or agent.run_dir is None:
        return []
    from mbr_launch.workers.stacks import StackTarget, dump_stacks

    out_dir = agent.run_dir / f"attempt_{rnd.index}" / "stacks"
    targets = [StackTarget(rank=w.rank, local_rank=w.local_rank, pid=w.pid,
                           faulthandler_file=Path(w.spec.env["MBR_STACK_FILE"])
                           if "MBR_STACK_FILE" in w.spec.env else None)
               for w in agent.workers if w.alive]
    try:
        dumps = dump_stacks(targets, out_dir, method=cfg.monitor.stack_dump, timeout=10.0)
    except Exception as err:  # diagnosis must never block the recovery
        agent.say(f"stack dump failed: {err}")
        return []
    records = [{"local_rank": d.local_rank, "rank": d.rank, "path": str(d.path) if d.path else None, "method": d.method,
                "summary": d.summary} for d in dumps]
    if agent.log:
        agent.log.emit("stacks", round=rnd.index, method=sorted({r["method"] for r in records}),
                       paths=[r["path"] for r in records])
    for r in records:
        agent.say(f"stacks of rank {r['rank']} ({r['method']}): {r['path']}  [{r['summary']}]")
    return records
