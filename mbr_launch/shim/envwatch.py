"""The environment variables a standby's extra preload (``--standby-preload``) read, and a warning when the
script's environment disagrees with what that preload saw.

torch._dynamo reads hundreds of variables at import, so a script that sets one after a standby preloaded it
finds it ignored; this makes that loud. While a module is preloaded (``recording``), ``os.environ``'s class is
swapped for ``Recording`` (every reference and ``os.getenv`` covered) to record each key read and written.
After the hand-over (``adopt``) the script's changes are judged at its first import of a preloaded module and
at its exit, never on timing. Not seen: getenv(3) from C. Standard library only.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from contextlib import contextmanager
from typing import Callable, Iterator, Mapping

# variable -> (the value the preload saw first, None where it was unset; the module whose import read it)
Reads = dict[str, "tuple[str | None, str]"]

# module -> (what its import read, what it wrote), filled in the fork server (``workers.forkserver``): a standby
# forked with the module imported takes the record from here (its own import would record nothing).
PRELOADED: dict[str, "tuple[Reads, dict[str, str | None]]"] = {}


class Recording(os._Environ):  # type: ignore[name-defined,misc,type-arg]  # os.environ's own class
    """``os.environ`` while a module is preloaded: reads go to ``reads``, writes to ``written`` (None: deleted)."""

    reads: Reads = {}
    written: dict[str, "str | None"] = {}
    module = ""

    def _saw(self, key: object) -> None:
        if isinstance(key, str) and key not in Recording.reads:
            try:
                value: str | None = os._Environ.__getitem__(self, key)  # type: ignore[attr-defined]
            except KeyError:
                value = None
            Recording.reads[key] = (value, Recording.module)

    def __getitem__(self, key):  # type: ignore[no-untyped-def]
        self._saw(key)
        return super().__getitem__(key)

    def get(self, key, default=None):  # type: ignore[no-untyped-def]
        self._saw(key)
        return super().get(key, default)

    def __contains__(self, key):  # type: ignore[no-untyped-def]
        self._saw(key)
        return super().__contains__(key)

    def __setitem__(self, key, value):  # type: ignore[no-untyped-def]
        self._saw(key)
        super().__setitem__(key, value)
        Recording.written[key] = value

    def __delitem__(self, key):  # type: ignore[no-untyped-def]
        self._saw(key)
        super().__delitem__(key)
        Recording.written[key] = None


@contextmanager
def recording(reads: Reads, written: dict[str, "str | None"], module: str,
              environ: "os._Environ[str]" = os.environ) -> Iterator[None]:  # type: ignore[name-defined]
    """Record into ``reads`` and ``written`` what importing ``module`` in the body does with ``environ``;
    nothing where its class is not ``os._Environ`` itself (swapping someone's replacement would lose it)."""
    if type(environ) is not os._Environ:  # type: ignore[attr-defined]
        yield
        return
    Recording.reads, Recording.written, Recording.module = reads, written, module
    environ.__class__ = Recording
    try:
        yield
    finally:
        environ.__class__ = os._Environ  # type: ignore[attr-defined]


def set_by_script(reads: Reads, written: Mapping[str, "str | None"], launch: Mapping[str, str],
                  environ: Mapping[str, str], *, present_only: bool = False) -> list[str]:
    """Recorded keys the script gave another value than the launch's, the one the preload saw and the
    preload's own write. ``present_only``: skip absent keys (a clear-and-restore may be under way)."""
    found = []
    for key, (seen, _) in reads.items():
        now = environ.get(key)
        if now is None and present_only:
            continue
        if now != launch.get(key) and now != seen and (key not in written or now != written[key]):
            found.append(key)
    return sorted(found)


def warning(keys: list[str], modules: list[str]) -> str:
    """The one line a rank gets: which variables, which preloaded modules, what to do."""
    it, was = ("it", "was") if len(modules) == 1 else ("them", "were")
    them = "it" if len(keys) == 1 else "them"
    return (f"mbr-launch: warm standby: {', '.join(modules)} {was} imported before this script ran "
            f"(--standby-preload), so {', '.join(keys)}, set by the script, may have no effect on {it}; set {them} "
            "in the launch environment instead, or run with --standby-preload none")


# Variables already warned about in this process (shim.standby's own warning leaves them out).
reported: set[str] = set()
_lock = threading.Lock()


class Judged:
    """What ``settle`` compares after the hand-over (``adopt``); empty before it and in other processes."""

    reads: Reads = {}
    written: Mapping[str, "str | None"] = {}
    launch: Mapping[str, str] = {}
    environ: "Mapping[str, str] | None" = None


def settle(present_only: bool = False) -> None:
    """Warn, in one line, about the recorded variables the script changed, each once per process."""
    with _lock:
        if Judged.environ is None:
            return
        keys = [key for key in set_by_script(Judged.reads, Judged.written, Judged.launch, Judged.environ,
                                             present_only=present_only) if key not in reported]
        reported.update(keys)
    if keys:
        modules = sorted({Judged.reads[key][1] for key in keys})
        print(warning(keys, modules), file=sys.stderr, flush=True)


def adopt(reads: Reads, written: Mapping[str, "str | None"], launch: Mapping[str, str],
          environ: "os._Environ[str]" = os.environ) -> None:  # type: ignore[name-defined]
    """Judge the script's changes at its first import of a preloaded module (keys present) and at exit (all).
    ``launch``: the rank's environment from the launch, whose values are never reported."""
    if not reads or type(environ) is not os._Environ:  # type: ignore[attr-defined]
        return
    with _lock:
        Judged.reads, Judged.written, Judged.launch, Judged.environ = reads, written, dict(launch), environ
    atexit.register(settle)
    # the first import, outside mbr_launch, of a preloaded module or one under it (also a library's)
    modules = {module for _, module in reads.values()}
    on_first_import(lambda name, fromlist, level: level == 0 and _preloaded(name, fromlist, modules),
                    lambda: settle(present_only=True))


def _preloaded(name: str, fromlist: object, modules: set[str]) -> bool:
    names = [name]
    if isinstance(fromlist, (tuple, list)):
        names += [f"{name}.{item}" for item in fromlist if isinstance(item, str)]
    return any(n == m or n.startswith(m + ".") for n in names for m in modules)


def on_first_import(wanted: Callable[[str, object, int], bool], act: Callable[[], None]) -> None:
    """Run ``act`` once, just before the first import statement outside mbr_launch for which ``wanted(name,
    fromlist, level)`` holds; the hook then takes itself out where it still can."""
    import builtins

    original = builtins.__import__
    fired = threading.Event()

    def hook(name, globals=None, locals=None, fromlist=(), level=0):  # type: ignore[no-untyped-def]
        if (not fired.is_set() and wanted(name, fromlist, level)
                and not str((globals or {}).get("__name__", "")).startswith("mbr_launch")):
            fired.set()
            if builtins.__import__ is hook:
                builtins.__import__ = original
            act()
        return original(name, globals, locals, fromlist, level)

    builtins.__import__ = hook


# ---- the hand-over -------------------------------------------------------------------------------------------


class Adoption:
    """``adopt`` once the preload is over and the environment is the rank's, by whichever comes second."""

    def __init__(self, reads: Reads, written: dict[str, str | None]) -> None:
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
            adopt(self._reads, self._written, self._launch)


def replace_environ(env: Mapping[str, str]) -> None:
    """``os.environ`` becomes ``env`` exactly, never empty in between (a preload may still run in its thread)."""
    for key, value in env.items():
        if os.environ.get(key) != value:
            os.environ[key] = value
    for key in [k for k in os.environ if k not in env]:
        del os.environ[key]


def finish_preload_when_needed(preloading: threading.Thread) -> None:
    """A fork waits for the preload (a child would inherit the preload thread's import locks)."""
    def before_fork() -> None:
        if threading.current_thread() is not preloading:
            preloading.join()

    os.register_at_fork(before=before_fork)
