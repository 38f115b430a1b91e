"""The payloads of the monitor's larger events: a rank's status row, expiries, timeout updates.

Pure: each function reads a slot (lock held by the caller) and returns the event as the agent reads it.
Times are rounded to the microsecond so lines stay short.
"""

from __future__ import annotations

from typing import Any, Optional

from mbr_launch.monitor.deadlines import Expiry
from mbr_launch.monitor.protocol import UpdateConfig
from mbr_launch.monitor.state import Slot
from mbr_launch.monitor.wire import STEP_KIND, MonitorEvent


def _age(now: float, since: Optional[float]) -> Optional[float]:
    return None if since is None else round(now - since, 6)


def describe(slot: Slot, now: float) -> dict[str, Any]:
    """One rank's row in ``snapshot`` and ``status`` events."""
    w, steps = slot.watch, slot.steps
    return {
        "local_rank": slot.local_rank,
        "rank": slot.rank,
        "pid": slot.pid,
        "state": w.phase.value,
        "connected": slot.active is not None,
        "last_heartbeat_age": _age(now, w.last_hb),
        "open_sections": list(w.open_sections),
        "heartbeats": w.heartbeats,
        "timeouts": w.timeouts.as_dict(),
        "steps": steps.steps,
        "step": steps.last_index,
        "last_step_age": _age(now, steps.last_at),
        "last_step_time": steps.last_period,
        "step_deadline_enforced": steps.armed and steps.enforced,
        "first_step_at": steps.first_at,
        "last_step_at": steps.last_at,
        "checkpoint_at": steps.checkpoint_at,
        "work_at": steps.work_at,  # the worker's collectives counted as training (autobeat's WORK mark)
        "progress": steps.progress,  # its first sign of progress (steps.PROGRESS_SIGNS); None: still starting
        "progress_at": steps.progress_at,
        "nvrx": slot.client_version,  # the generation of the rank's NVRx client ("0.4.1", "0.6+"), if any
        "iteration": w.iteration,  # the training iteration a 0.6+ client reports in "step" (Megatron)
        "first_iteration": w.first_iteration,  # ... the first of this session: where it (re)started
    }


def first_progress(slot: Slot, sign: str, now: float) -> dict[str, Any]:
    """A worker's first sign of progress that was neither a step nor a heartbeat (those have their own
    events): a checkpoint, enough collectives, an advancing iteration."""
    return {"ev": MonitorEvent.FIRST_PROGRESS, "local_rank": slot.local_rank, "rank": slot.rank, "kind": sign,
            "t": round(now - slot.watch.armed_at, 6), "monotonic": now}  # t: seconds since the worker's arm


def ranks_event(name: MonitorEvent, slots: list[Slot], now: float) -> dict[str, Any]:
    """A ``snapshot`` or ``status`` event: every rank's row, in local rank order."""
    return {"ev": name, "ranks": [describe(s, now) for s in slots]}


def expired(slot: Slot, expiry: Expiry, now: float) -> dict[str, Any]:
    """A heartbeat or section deadline passed."""
    w = slot.watch
    return {
        "ev": MonitorEvent.EXPIRED,
        "local_rank": slot.local_rank,
        "rank": slot.rank,
        "pid": slot.worker_pid(),
        "kind": expiry.kind.value,
        "section": expiry.section,
        "timeout": expiry.timeout,
        "elapsed": round(expiry.elapsed, 6),
        "open_sections": list(w.open_sections),
        "last_heartbeat_age": _age(now, w.last_hb),
        "iteration": w.iteration,
        "monotonic": now,
    }


def step_expired(slot: Slot, timeout: float, elapsed: float, now: float) -> dict[str, Any]:
    """No step beat came within the step timeout."""
    return {
        "ev": MonitorEvent.EXPIRED, "local_rank": slot.local_rank, "rank": slot.rank,
        "pid": slot.worker_pid(), "kind": STEP_KIND,
        "section": None, "timeout": timeout, "elapsed": round(elapsed, 6),
        "open_sections": list(slot.watch.open_sections), "step": slot.steps.last_index,
        "last_heartbeat_age": _age(now, slot.steps.last_at),
        "monotonic": now,
    }


def timeouts_updated(slot: Slot, req: UpdateConfig) -> dict[str, Any]:
    """The client changed its timeouts (NVRx's calculated timeouts, or the script's own)."""
    hb, sec = req.hb, req.section
    return {
        "ev": MonitorEvent.TIMEOUTS_UPDATED,
        "local_rank": slot.local_rank,
        "hb": None if hb is None else {"initial": hb.initial, "subsequent": hb.subsequent,
                                       "were_calculated": hb.were_calculated},
        "section": None if sec is None else {
            "section": dict(sec.section),
            "out_of_section": sec.out_of_section,
            "calculated_sections": list(sec.calculated_sections),
            "is_out_of_section_calculated": sec.is_out_of_section_calculated,
        },
    }
