"""How a process ended: exit code or signal, with a hint a person can act on ("SIGKILL: out of memory?").

Lives in report/ (not workers/) because failure records and the summary describe exits too, and report is
the lower layer: workers import it, never the reverse.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

SIGNAL_HINTS = {
    "SIGKILL": "killed: out of memory (check dmesg) or killed by the scheduler?",
    "SIGSEGV": "segmentation fault: a crash in native code (CUDA, NCCL, an extension)",
    "SIGABRT": "aborted: an assertion or a C++ exception (NCCL watchdog timeouts abort too)",
    "SIGBUS": "bus error: /dev/shm too small or a broken memory-mapped file?",
    "SIGTERM": "terminated by someone else (scheduler, user, preemption?)",
    "SIGINT": "interrupted (Ctrl-C)",
    "SIGFPE": "arithmetic error in native code",
    "SIGILL": "illegal instruction: a binary built for another CPU?",
}


@dataclass(frozen=True)
class ExitStatus:
    code: int | None  # exit code when it exited
    signal: str | None  # signal name when a signal killed it

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
            hint = SIGNAL_HINTS.get(self.signal)
            return f"{self.signal}" + (f" ({hint})" if hint else "")
        return f"exit code {self.code}"
