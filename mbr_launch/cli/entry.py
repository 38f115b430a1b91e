"""The console script ``mbr-launch`` (and ``python -m mbr_launch``): the collector paused, then the CLI.

Kept apart from ``app`` so that the pause (``mbr_launch.startup``) comes before typer, rich and torch are
imported; tests import ``app`` in their own process and keep their collector.
"""

from __future__ import annotations

from mbr_launch.startup import pause_gc


def entry() -> None:
    pause_gc()
    from mbr_launch.cli.app import entry as run

    run()
