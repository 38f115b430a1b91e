"""How a command fails in front of a person: one line on stderr and an exit code, never a traceback."""

from __future__ import annotations

import sys

from mbr_launch.report import exitcodes

PROG = "mbr-launch"


class CommandError(Exception):
    """A failure the user can fix: printed as one line, exit ``code``."""

    def __init__(self, message: str, code: int = exitcodes.USAGE) -> None:
        super().__init__(message)
        self.code = code


def error(message: str) -> None:
    if sys.stderr is None:  # started with stderr closed; print(file=None) would write to stdout instead
        return
    try:
        print(f"{PROG}: error: {message}", file=sys.stderr, flush=True)
    except OSError:  # stderr is a pipe nobody reads any more: the exit code still says it
        pass
