"""The launcher's start-up without the cyclic garbage collector (standard library only: runs first).

Imports make almost no cyclic garbage, yet the collector walks their million objects again and again
(measured: benchmarks/RESULTS.md). It is paused from the console script's first line until the launch path
has imported what it needs; the survivors are then frozen (``gc.freeze``) so later collections skip them.
"""

from __future__ import annotations

import gc

_paused = False


def pause_gc() -> None:
    """Stop automatic collection for the start-up (no-op when someone else already disabled it)."""
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


def resume_gc() -> None:
    """Freeze what the imports made, collect automatically again; a no-op unless ``pause_gc`` paused it."""
    global _paused
    if _paused:
        _paused = False
        gc.freeze()
        gc.enable()
