"""The rank monitor process as the agent holds it; its events are decoded on the reader thread and posted."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Iterable

from mbr_launch import outside
from mbr_launch.agent.messages import Event, decode_monitor_event
from mbr_launch.monitor.link import MonitorLink


class MonitorHandle:
    def __init__(self, *, enabled: bool, sock_dir: Path, ft: dict[str, Any], steps: dict[str, Any] | None,
                 env: dict[str, str], post: Callable[[Event], None],
                 on_link: Callable[[MonitorLink | None], None], early: MonitorLink | None = None) -> None:
        self._enabled = enabled
        self._early = early  # the monitor's process, spawned by the launcher before it imported torch
        self._sock_dir, self._ft, self._env = sock_dir, ft, env
        self.steps = steps  # step deadlines and status rows, as the features asked (``agent.features``)
        self._post = post
        self._on_link = on_link  # the worker group arms its ranks through the current link
        self.link: MonitorLink | None = None

    def start(self) -> None:
        if not self._enabled:
            return
        link, self._early = self._early, None
        self.link = link or MonitorLink(env=dict(self._env))
        self.link.on_event = self._on_raw
        self.link.start(self._sock_dir, self._ft, steps=self.steps)
        self._on_link(self.link)

    restart = start  # after the monitor died (``reap``)

    def _on_raw(self, raw: dict[str, Any]) -> None:
        event = decode_monitor_event(raw)
        if event is not None:
            self._post(event)

    @property
    def pidfd(self) -> int | None:
        return self.link.pidfd if self.link else None

    def reap(self) -> int | None:
        """The monitor exited (its pidfd is readable): forget it; its exit code."""
        assert self.link is not None
        code = self.link.exit_code()
        if self.link.pidfd is not None:
            os.close(self.link.pidfd)
            self.link.pidfd = None
        self.link = None
        self._on_link(None)
        return code

    def pending_signals(self) -> frozenset[int] | None:
        """The job's signals sent to the monitor's process too (``monitor.witness``); None without a monitor."""
        return self.link.pending_signals() if self.link else None

    def snapshot(self) -> dict[str, Any] | None:
        return self.link.snapshot(timeout=1.0) if self.link else None

    def last_sections(self, local_ranks: Iterable[int]) -> dict[int, str | None]:
        """Each rank's open sections ("a,b"; None: none, or no answer), from one snapshot."""
        wanted = dict.fromkeys(local_ranks)
        try:
            snap = self.snapshot()
        except Exception:
            return wanted
        for entry in (snap or {}).get("ranks", []):
            local_rank = entry.get("local_rank")
            if local_rank in wanted and entry.get("open_sections"):
                wanted[local_rank] = ",".join(entry["open_sections"])
        return wanted

    def ages(self, local_ranks: Iterable[int]) -> dict[int, float]:
        """Seconds since each rank's last heartbeat or step, from one snapshot; unknown ones left out."""
        wanted = set(local_ranks)
        try:
            snap = self.snapshot()
        except Exception:
            return {}
        out = {}
        for entry in (snap or {}).get("ranks", []):
            ages = [a for a in (outside.finite(entry.get("last_heartbeat_age"), 0.0),
                                outside.finite(entry.get("last_step_age"), 0.0)) if a is not None]
            if entry.get("local_rank") in wanted and ages:
                out[entry["local_rank"]] = min(ages)
        return out

    def close(self, timeout: float = 5.0) -> None:
        for link in (self.link, self._early):
            if link:
                link.close(timeout=timeout)
