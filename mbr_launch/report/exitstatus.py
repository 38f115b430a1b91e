"""How a process ended: exit code or signal; for a signal, who sent it as far as the node could tell
(``workers.killcause``), else a hint where the signal itself says something (SIGSEGV: a crash in native code).
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from enum import Enum

# What the signal says by itself: raised by the process's own fault, almost always.
SIGNAL_HINTS = {
    "SIGSEGV": "segmentation fault: a crash in native code (CUDA, NCCL, an extension)",
    "SIGABRT": "aborted: an assertion or a C++ exception (NCCL watchdog timeouts abort too)",
    "SIGBUS": "bus error: /dev/shm too small or a broken memory-mapped file?",
    "SIGFPE": "arithmetic error in native code",
    "SIGILL": "illegal instruction: a binary built for another CPU?",
}


class Killer(Enum):
    OOM = "oom"  # the kernel's OOM killer, by its counter or its log
    LAUNCHER = "launcher"  # this launcher's own stop
    UNKNOWN = "unknown"  # someone else, not seen from here


@dataclass(frozen=True)
class KillCause:
    killer: Killer
    text: str  # what was seen, for the line: "the kernel's OOM killer: ..."


@dataclass(frozen=True)
class ExitStatus:
    code: int | None  # exit code when it exited
    signal: str | None  # signal name when a signal killed it
    cause: KillCause | None = None  # who sent the signal, when the agent looked (``workers.killcause``)

    @property
    def ok(self) -> bool:
        return self.code == 0

    @staticmethod
    def from_returncode(returncode: int) -> "ExitStatus":
        if returncode < 0:
            try:
                return ExitStatus(code=None, signal=signal.Signals(-returncode).name)
            except ValueError:
                return ExitStatus(code=None, signal=f"signal {-returncode}")
        return ExitStatus(code=returncode, signal=None)

    def describe(self) -> str:
        if self.signal:
            said = self.cause.text if self.cause else SIGNAL_HINTS.get(self.signal)
            return f"{self.signal}" + (f" ({said})" if said else "")
        return f"exit code {self.code}"

    @property
    def killed_by(self) -> str | None:
        """The sender's kind for events: oom, launcher, unknown; None where not looked at or not a signal."""
        return self.cause.killer.value if self.cause else None
