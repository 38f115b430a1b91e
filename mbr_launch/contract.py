"""What the agent and the code inside its workers (``mbr_launch.shim``) agree on; standard library only.

Environment variable names, signals and small wire formats, taken from here by both sides, so the shim never
imports the agent's modules (or torch) and the agent never imports code meant to run inside a worker.
"""

from __future__ import annotations

import json
import signal
import struct
from typing import Mapping, NamedTuple

# How the agent starts every worker (and standby): ``python -u -m BOOT_MODULE (-m MODULE | SCRIPT) ARGS``.
BOOT_MODULE = "mbr_launch.shim.boot"

# ---- environment variables the agent sets in a worker's environment ---------------------------------------

# faulthandler dumps every thread's stack into this file on STACK_SIGNAL (boot arms it).
STACK_FILE_ENV = "MBR_STACK_FILE"
# "1": boot installs the optimizer-step hook (shim.autobeat), which sends to the monitor's AUTOBEAT_SOCKET_ENV.
AUTOBEAT_ENV = "MBR_AUTOBEAT"
AUTOBEAT_SOCKET_ENV = "MBR_AUTOBEAT_SOCKET"
# Comma-separated signal names the worker ignores (Slurm's preemption signals; the agent forwards its own).
IGNORE_SIGNALS_ENV = "MBR_IGNORE_SIGNALS"
# ``FD:LEVEL:DELAY``, set in warm standbys only: boot waits on pipe FD for the assignment (see shim.standby).
STANDBY_CHANNEL_ENV = "MBR_STANDBY_CHANNEL"
# --standby-preload's modules, set in standbys only (always: it hides the setting's own variable of the same
# name). A module marked OPTIONAL_PRELOAD comes from the default list: one that cannot be imported is skipped.
STANDBY_PRELOAD_ENV = "MBR_STANDBY_PRELOAD"
OPTIONAL_PRELOAD = "?"
# What standbys of these levels also import when --standby-preload is not given.
DEFAULT_PRELOAD = {"torch": ("torch._dynamo",), "cuda": ("torch._dynamo",)}

# A FIFO the worker keeps open (``shim.flight``): each byte asks for a Flight Recorder dump into FR_FILE_ENV.
FR_TRIGGER_ENV = "MBR_FR_TRIGGER"
FR_FILE_ENV = "MBR_FR_FILE"
# CUDA builds keep NCCL's recorder apart from gloo's: its dump goes to MBR_FR_FILE + this suffix.
FR_NCCL_SUFFIX = ".nccl"

# --standby levels, cheapest first: what a standby pre-initialises before the script's first line.
STANDBY_LEVELS = ("off", "interpreter", "torch", "cuda")


# NamedTuples, not dataclasses: boot imports this module in every worker, and dataclasses pulls in inspect.
class StandbyChannel(NamedTuple):
    """``MBR_STANDBY_CHANNEL``: where a standby reads its assignment, and how it prepares meanwhile."""

    fd: int  # read end of the assignment pipe, inherited by the standby
    level: str  # one of STANDBY_LEVELS[1:]
    delay: float  # seconds to wait before preloading (an assignment during the wait skips preloading)
    status: int = -1  # write end of a pipe on which the standby writes STANDBY_WARM once preloaded (-1: none)
    background: bool = False  # the agent runs it at the lowest CPU priority: preload at once, without ``delay``

    def encode(self) -> str:
        return f"{self.fd}:{self.level}:{self.delay:g}:{self.status}:{int(self.background)}"

    @staticmethod
    def decode(text: str) -> "StandbyChannel":
        fd, level, delay, *rest = text.split(":")
        status, background = (int(rest[0]), rest[1] == "1") if len(rest) == 2 else (-1, False)
        return StandbyChannel(fd=int(fd), level=level, delay=float(delay), status=status, background=background)


STANDBY_WARM = b"w"  # the standby has preloaded its level


class Assignment(NamedTuple):
    """What the agent sends a standby once, when it becomes a rank: one JSON message, then end of pipe."""

    argv: tuple[str, ...]  # the worker's command line (the standby already runs it; the agent checked)
    env: dict[str, str]  # the worker's environment, exactly: the standby replaces os.environ with it
    cwd: str

    def encode(self) -> bytes:
        return json.dumps({"argv": list(self.argv), "env": self.env, "cwd": self.cwd}).encode()

    @staticmethod
    def decode(message: bytes) -> "Assignment":
        data = json.loads(message)
        return Assignment(argv=tuple(data["argv"]), env=dict(data["env"]), cwd=data["cwd"])

# ---- signals ---------------------------------------------------------------------------------------------

# A real-time signal nobody else uses: SIGUSR1/SIGUSR2 belong to users and Slurm preemption.
STACK_SIGNAL = signal.SIGRTMIN + 5


def preemption_signals(environ: Mapping[str, str]) -> tuple[signal.Signals, ...]:
    """The signals ``MBR_IGNORE_SIGNALS`` names (unknown names are skipped)."""
    names = environ.get(IGNORE_SIGNALS_ENV, "").split(",")
    return tuple(signal.Signals[n] for n in names if n in signal.Signals.__members__)


# ---- step beats (worker -> rank monitor datagrams) -------------------------------------------------------

# step index (u32), step period (f32 s), CPU time of the stepping thread in that period (f32 s), flags (u32)
BEAT = struct.Struct("<IffI")
FIRST = 1  # flags: the first step of this process (its period runs from install(), i.e. includes start-up)
FINISHED = 2  # flags: the script is done stepping (destroy_process_group, exit): not a step
CHECKPOINT = 4  # flags: a checkpoint save returned (torch.save of a dict, torch.distributed.checkpoint): not a step
WORK = 8  # flags: the process has made enough collectives to be training (sent once): not a step
# What a CHECKPOINT or WORK mark tells the monitor: the worker is past start-up (``first_progress``).
