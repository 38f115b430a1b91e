"""The hand-over of a standby to its rank while its preload may still be running in its own thread.

A standby assigned mid-preload runs the script at once (``shim.standby``); these are the pieces that keep
that safe: the environment replaced without an empty moment, the script's fork waiting for the preload, and
``envwatch`` adopting the rank's environment only once the preload's imports no longer record.
Standard library only (and ``envwatch``).
"""

from __future__ import annotations

import os
import threading
from typing import Mapping

from mbr_launch.shim import envwatch


class Adoption:
    """``envwatch.adopt`` once both the preload is over (its imports no longer record) and the environment is
    the rank's; whichever of the two comes second does it, on its own thread."""

    def __init__(self, reads: envwatch.Reads, written: dict[str, str | None]) -> None:
        self._reads, self._written = reads, written
        self._launch: Mapping[str, str] = {}
        self._lock = threading.Lock()
        self._done = self._ready = self._adopted = False

    def preload_done(self) -> None:
        with self._lock:
            self._done = True
        self._maybe()

    def environment_ready(self, launch: Mapping[str, str]) -> None:
        """``launch``: the environment the launch gave the rank (the assignment's)."""
        with self._lock:
            self._ready, self._launch = True, launch
        self._maybe()

    def _maybe(self) -> None:
        with self._lock:
            go = self._done and self._ready and not self._adopted
            self._adopted = self._adopted or go
        if go:
            envwatch.adopt(self._reads, self._written, self._launch)


def replace_environ(env: Mapping[str, str]) -> None:
    """``os.environ`` becomes ``env`` exactly. Changed and new keys first, then the removed ones: a preload
    still running in its thread never sees an empty environment in between (``clear()`` then ``update()``
    would show it one)."""
    for key, value in env.items():
        if os.environ.get(key) != value:
            os.environ[key] = value
    for key in [k for k in os.environ if k not in env]:
        del os.environ[key]


def finish_preload_when_needed(preloading: threading.Thread) -> None:
    """The script runs while the preload finishes. It waits for the preload where sharing the process with it
    would not be safe: before a fork (a child would inherit import locks held by the preload thread) and at
    its first ``import torch`` (``_watch_torch_import``); an exit waits for the thread (not a daemon)."""
    def before_fork() -> None:
        if threading.current_thread() is not preloading:
            preloading.join()

    os.register_at_fork(before=before_fork)
