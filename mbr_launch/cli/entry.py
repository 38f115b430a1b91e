"""The console script ``mbr-launch`` (and ``python -m mbr_launch``).

Pauses the collector before typer, rich and torch are imported, and runs a plain launch line without typer
(``cli.plainline``). Kept apart from ``app`` so that tests can import ``app`` and keep their collector."""

from __future__ import annotations

import os
import sys

from mbr_launch.gcpause import pause_gc


def entry() -> None:
    pause_gc()
    from mbr_launch.cli import plainline

    code = plainline.run(sys.argv[1:])
    if code is None:
        from mbr_launch.cli.app import main

        code = main()
    # Everything of ours is stopped and flushed by now; skip interpreter teardown, where torch's C++
    # objects still referenced by stray threads could abort the process and change the exit code.
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:  # None: started with the descriptor closed (`>&-`)
                stream.flush()
        except (OSError, ValueError):  # a reader that went away (`| head`): the exit code still counts
            pass
    os._exit(code)
