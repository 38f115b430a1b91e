"""The rank monitor as the witness of a signal sent to every process of a Slurm step: it holds the job's signals
blocked (and ignored), so that one sent to it stays pending, where the agent reads it in ``/proc/PID/status``.

Why it tells a signal to the job from one to the node: Slurm delivers ``scancel --signal``, a preemption and a
time limit's signal to every process of the step on every node, whatever its session (tests/test_slurm_cluster.py,
``test_scancel_signal_delivery``), and has no request that signals one node's part of a step. The monitor runs
in a session of its own, so a Ctrl-C on the launcher's terminal or a ``kill`` of the launcher does not reach it.
So, inside a Slurm step, a stop signal pending at this node's monitor came from Slurm to the whole step: the
agent knows it from its own node, whatever the other nodes' delays (``agent.leaving``).

A blocked signal is never discarded (the kernel keeps it pending even with the disposition SIG_IGN) and is
never delivered: the monitor's life still ends only through the agent (``exit``, stdin EOF) or SIGKILL. The mask
is set before the monitor starts a thread, so every thread inherits it (a thread that left it unblocked would
take the signal and drop it). A process's pending set does not survive its death: a restarted monitor starts
clean. Standard library only (the monitor's start-up imports it).
"""

from __future__ import annotations

import signal

# The signals a launcher handles by default (torchrun's SIGTERM, SIGINT, SIGHUP, SIGQUIT) and the usual
# preemption notices (Slurm's --signal=USR1@T; USR2): a signal outside these is not witnessed.
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
