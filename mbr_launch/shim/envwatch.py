"""The environment variables a standby's extra preload (``--standby-preload``) read, and a warning when the
script's environment disagrees with what that preload saw.

torch._dynamo (with inductor, functorch and sympy) reads about 280 variables when it is imported, torch 2.13:
its config modules through ``os.environ.get`` and ``os.getenv`` (``torch.utils._config_module`` too), the
standard library some generic ones (``sysconfig``: HOME, PYTHONUSERBASE; ``tempfile``: TMPDIR; ``getpass``:
USER). A standby that imported it before the script ran decided all of them with the standby's environment,
so a script that sets one after its own ``import torch`` (where a fresh process would import dynamo later, at
its first ``DistributedDataParallel``) would find it ignored. Nothing here changes that; it makes it loud:

- While a module is preloaded (``recording``), ``os.environ`` is an instance of ``Recording``: the object
  stays the same, only its class is swapped, so every module's reference to it and ``os.getenv`` are covered.
  Every key looked up (``[]``, ``get``, ``in``) is recorded with the value seen (None: absent), and every key
  the import wrote (inductor sets TORCHINDUCTOR_CACHE_DIR) with the value it left.
- After the hand-over (``adopt``, once the assignment has replaced the environment), a recorded key the
  rank's environment has another value of is warned about at once, and ``os.environ`` becomes a ``Watching``
  instance, which warns, once per variable, when the script sets or deletes a recorded key to anything but
  what the preload saw. Writes cost one dictionary look-up more; reads nothing.
- Values are compared, not writes: a write to a watched key is looked at again ``SETTLE`` seconds later, and
  only what still differs then is reported, in one line. Hugging Face accelerate's ``clear_environment()``
  clears ``os.environ`` and restores it unchanged (a restarted rank printed one warning per variable, 66
  lines for one rank); that says nothing now.

Not seen: reads by C or C++ code (getenv(3)) and by code that copied the environment before the preload.
Standard library only: ``shim.standby`` imports it before anything is preloaded.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from contextlib import contextmanager
from typing import Iterator, Mapping

# variable -> (the value the preload saw first, None where it was unset; the module whose import read it)
Reads = dict[str, "tuple[str | None, str]"]


class Recording(os._Environ):  # type: ignore[name-defined,misc,type-arg]  # os.environ's own class
    """``os.environ`` while a module is preloaded: what the import reads goes to ``reads``, what it writes to
    ``written`` (None: deleted)."""

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


class Watching(os._Environ):  # type: ignore[name-defined,misc,type-arg]
    """``os.environ`` after the hand-over: a write to a watched key is noted, and ``settle`` (``SETTLE`` seconds
    later, on a timer thread) reports, once per key, those whose value then differs from what the preload saw
    (such a key is no longer watched)."""

    watched: Reads = {}
    touched: set[str] = set()  # watched keys written since the last settle
    environ: "os._Environ[str] | None" = None  # type: ignore[name-defined]
    timer: "threading.Timer | None" = None

    def __setitem__(self, key, value):  # type: ignore[no-untyped-def]
        _set(self, key, value)  # not super(): this runs on every write the script makes
        if key in Watching.watched:
            _touch(key)

    def __delitem__(self, key):  # type: ignore[no-untyped-def]
        _delete(self, key)
        if key in Watching.watched:
            _touch(key)


SETTLE = 0.5  # seconds: a clear-and-restore takes microseconds; a script's own setting stays
_lock = threading.Lock()


def _touch(key: str) -> None:
    with _lock:
        Watching.touched.add(key)
        if Watching.timer is None:
            Watching.timer = threading.Timer(SETTLE, settle)
            Watching.timer.daemon = True
            Watching.timer.start()


def settle() -> None:
    """Report (one line) the watched keys written since the last look whose value now differs from the
    preload's; those whose value came back keep being watched."""
    with _lock:
        keys, Watching.touched, Watching.timer = sorted(Watching.touched), set(), None
        environ = Watching.environ
        if environ is None:
            return
        changed = [key for key in keys if key in Watching.watched
                   and os._Environ.get(environ, key) != Watching.watched[key][0]]  # type: ignore[attr-defined]
        found = [Watching.watched.pop(key) for key in changed]
    if changed:
        _say(changed, sorted({module for _, module in found}), by_script=True)


_set, _delete = os._Environ.__setitem__, os._Environ.__delitem__  # type: ignore[attr-defined]


@contextmanager
def recording(reads: Reads, written: dict[str, "str | None"], module: str,
              environ: "os._Environ[str]" = os.environ) -> Iterator[None]:  # type: ignore[name-defined]
    """Record into ``reads`` and ``written`` what importing ``module`` in the body does with ``environ``
    (``os.environ``; another ``os._Environ`` in tests). Nothing is recorded where ``environ``'s class is not
    ``os._Environ`` itself (someone replaced it: swapping it would lose what theirs does)."""
    if type(environ) is not os._Environ:  # type: ignore[attr-defined]
        yield
        return
    Recording.reads, Recording.written, Recording.module = reads, written, module
    environ.__class__ = Recording
    try:
        yield
    finally:
        environ.__class__ = os._Environ  # type: ignore[attr-defined]


def differing(reads: Reads, written: Mapping[str, "str | None"], environ: Mapping[str, str]) -> list[str]:
    """Recorded keys whose value in ``environ`` is neither the one the preload saw nor the one it left."""
    return sorted(key for key, (value, _) in reads.items()
                  if environ.get(key) != value and (key not in written or environ.get(key) != written[key]))


def warning(keys: list[str], modules: list[str], by_script: bool) -> str:
    """The one line a rank gets: which variables, which preloaded modules, what to do."""
    it, was = ("it", "was") if len(modules) == 1 else ("them", "were")
    them = "it" if len(keys) == 1 else "them"
    how = "set by the script" if by_script else f"as this rank's environment has {them}"
    return (f"mbr-launch: warm standby: {', '.join(modules)} {was} imported before this script ran "
            f"(--standby-preload), so {', '.join(keys)}, {how}, may have no effect on {it}; set {them} in the "
            "launch environment instead, or run with --standby-preload none")


# Variables already warned about in this process (shim.standby's warning about torch's import-time variables
# leaves them out).
reported: set[str] = set()


def _say(keys: list[str], modules: list[str], by_script: bool) -> None:
    reported.update(keys)
    print(warning(keys, modules, by_script), file=sys.stderr, flush=True)


def adopt(reads: Reads, written: Mapping[str, "str | None"],
          environ: "os._Environ[str]" = os.environ) -> None:  # type: ignore[name-defined]
    """After the hand-over: warn about what the rank's environment has otherwise than the preload saw, and
    watch the script's writes from now on. What the preload wrote went with the standby's environment, on
    purpose: the script's first line sees what a fresh process's does (inductor sets its cache directory
    again when it needs it)."""
    if not reads or type(environ) is not os._Environ:  # type: ignore[attr-defined]
        return
    now = differing(reads, written, environ)
    if now:
        _say(now, sorted({reads[k][1] for k in now}), by_script=False)
    Watching.watched = {key: found for key, found in reads.items() if key not in now}
    Watching.environ, Watching.touched = environ, set()
    atexit.register(settle)  # a script that ends within SETTLE of its write is still told
    environ.__class__ = Watching
