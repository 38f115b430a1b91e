"""The launcher's start-up without the cyclic garbage collector.

An agent imports its own modules and then torch's elastic stack (over a million objects) before its rank can start.
With the collector on, every few hundred allocations it walks the young objects and, as they age, the whole
heap: about 0.25 s of CPU per agent on this project's 2-core machine (1.35 s -> 1.07 s for the imports alone),
which 32 agents starting on 2 cores pay 32 times. Imports make almost no cyclic garbage, so the collector is
paused from the first line of the console script until the launch path has imported what it needs, and the
survivors are then frozen (``gc.freeze``): they live as long as the process, and later collections, over the
days an agent runs, no longer walk them.

Only the standard library here: this runs before anything else of ours is imported.
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
    """End the start-up: freeze what the imports made, collect automatically again. Idempotent; a no-op
    unless ``pause_gc`` paused it (the Python API, embedded in someone's process, leaves their collector be)."""
    global _paused
    if _paused:
        _paused = False
        gc.freeze()
        gc.enable()
