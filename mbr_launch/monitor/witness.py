"""The rank monitor as the witness of a signal sent to every process of a Slurm step: it holds the job's signals
blocked (and ignored), so that one sent to it stays pending, where the agent reads it in ``/proc/PID/status``.

Slurm delivers ``scancel --signal``, preemption and time-limit signals to every process of the step on every
node, and the monitor runs in a session of its own (a Ctrl-C or ``kill`` of the launcher misses it): a stop
signal pending here came to the whole step (``agent.leaving``). A blocked signal stays pending and is never
delivered. The mask is set before any thread starts, so every thread inherits it. Standard library only.
"""

from __future__ import annotations

import signal

# A launcher's default stop signals (torchrun's) and the usual preemption notices (Slurm's --signal=USR1@T).
JOB_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
MAX_BYTES = 8192  # /proc/PID/status is about 1.5 KiB


def hold_job_signals() -> None:
    """In the monitor, before any thread starts: keep ``JOB_SIGNALS`` pending instead of acting on them."""
    for sig in JOB_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, JOB_SIGNALS)


def pending(pid: int) -> frozenset[int] | None:
    """The signals pending at process ``pid`` (its own and its threads'); None when it cannot be read (gone)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            raw = f.read(MAX_BYTES)
    except OSError:
        return None
    return parse_pending(raw)


def parse_pending(raw: bytes) -> frozenset[int] | None:
    """The signal numbers in a ``/proc/PID/status`` text's ``ShdPnd`` (sent to the process) and ``SigPnd`` (to
    its main thread) masks; None when neither is there."""
    found, masks = set(), 0
    for line in raw.splitlines():
        name, _, value = line.partition(b":")
        if name not in (b"ShdPnd", b"SigPnd"):
            continue
        try:
            mask = int(value.strip()[:32], 16)  # 64 bits of hex; more is not a mask
        except ValueError:
            continue
        masks += 1
        found.update(bit + 1 for bit in range(mask.bit_length()) if mask >> bit & 1)
    return frozenset(found) if masks else None
