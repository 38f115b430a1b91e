"""What the fork server imports before its first fork (``--standby-preload``), once for every worker it forks.

Runs in the server, a single-threaded child of the launcher (``workers.forkserver``), before it answers.
"""

from __future__ import annotations

import os
import threading
from typing import Mapping, Sequence


def import_once(modules: Sequence[str], env: Mapping[str, str] | None) -> None:
    """Import ``modules`` once, here, before any fork: every standby forked after has them for nothing. A
    training script imports torch._dynamo (the default list) itself, at its optimizer's construction: as
    much CPU again as torch, which every standby and every restarted rank would otherwise pay (32 agents on 2
    cores: a restart's ranks took 50 s to their first step, where forked with it they take a few). What each
    import read from the environment (a standby's, ``env``) is kept for the standbys' ``envwatch``. A module
    that fails is left to the standby, which tries it itself and reports the failure there. Its warnings are not
    shown: they would come once, on the launcher's stderr, not on the ranks'."""
    import importlib
    import warnings

    from mbr_launch.shim import envwatch

    if env is not None:
        envwatch.replace_environ(env)  # the children replace it with their own; the imports read a standby's
    for name in modules:
        reads: envwatch.Reads = {}
        written: dict[str, str | None] = {}
        try:
            with warnings.catch_warnings(), envwatch.recording(reads, written, name):
                warnings.simplefilter("ignore")
                importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the standby meets it and reports it
            continue
        envwatch.PRELOADED[name] = (reads, written)
    if threading.active_count() != 1:
        os._exit(1)  # an import left a thread running: forking is no longer safe; the agent starts interpreters
