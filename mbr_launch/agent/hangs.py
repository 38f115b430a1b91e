"""A rank monitor's expiry, described for people (the verdict, in ``agent.inquiry``, decides who hung)."""

from __future__ import annotations

from mbr_launch.agent.messages import RankExpired

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
