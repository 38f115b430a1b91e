"""The monitor lives and dies with its agent.

It ignores the signals that hit a whole job (Ctrl-C, Slurm's SIGTERM and preemption signals): its life
ends only through the agent (``exit`` or stdin EOF) or SIGKILL. When the agent dies (stdin EOF, or a
broken stdout), nobody else is left to clean up, so every armed worker's process group is SIGKILLed.
"""

from __future__ import annotations

import os
import signal
from typing import Iterable

from mbr_launch.monitor.deadlines import Phase
from mbr_launch.monitor.state import Slot

JOB_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def ignore_job_signals() -> None:
    for sig in JOB_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def kill_armed(slots: Iterable[Slot]) -> None:
    """SIGKILL the process group (else the process) of every rank still armed."""
    for slot in slots:
        if slot.watch.phase is Phase.DISARMED:
            continue
        try:
            if slot.pgid is not None:
                os.killpg(slot.pgid, signal.SIGKILL)
            elif slot.pid is not None:
                os.kill(slot.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass  # already gone
