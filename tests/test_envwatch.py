"""What a standby's extra preload read from the environment, and the warnings after the hand-over
(``mbr_launch.shim.envwatch``): pure, on a private ``os._Environ`` (its writes reach the process's C
environment under names no one else uses, removed afterwards) and, for ``os.getenv``, on ``os.environ``."""

from __future__ import annotations

import builtins
import os
import sys

import pytest

from mbr_launch.shim import envwatch

pytestmark = pytest.mark.timeout(30)

P = "MBR_ENVWATCH_TEST_"
IMPORT = builtins.__import__


@pytest.fixture
def environ():
    e = os.environ
    env = os._Environ({}, e.encodekey, e.decodekey, e.encodevalue, e.decodevalue)
    env[P + "SEEN"] = "1"
    yield env
    env.__class__ = os._Environ
    for key in list(env):
        del env[key]
    envwatch.reported.clear()
    envwatch.Judged.environ = None
    builtins.__import__ = IMPORT  # a hook that never fired


def test_recording_sees_every_way_of_reading_and_writing_and_puts_the_class_back(environ):
    reads: envwatch.Reads = {}
    written: dict = {}
    with envwatch.recording(reads, written, "first", environ):
        assert type(environ) is envwatch.Recording
        assert environ[P + "SEEN"] == "1" and environ.get(P + "ABSENT") is None and (P + "IN") not in environ
        environ.setdefault(P + "WRITTEN", "w")  # a read (absent) and a write
        environ.pop(P + "SEEN")  # read first (value 1), then deleted
    assert type(environ) is os._Environ
    with pytest.raises(RuntimeError), envwatch.recording(reads, written, "second", environ):
        environ.get(P + "LATER")
        environ.get(P + "ABSENT")  # the first module to read a key keeps it
        raise RuntimeError("an import that fails")
    assert type(environ) is os._Environ
    assert reads == {P + "SEEN": ("1", "first"), P + "ABSENT": (None, "first"), P + "IN": (None, "first"),
                     P + "WRITTEN": (None, "first"), P + "LATER": (None, "second")}
    assert written == {P + "WRITTEN": "w", P + "SEEN": None}
    # os.getenv goes through os.environ.get, which is what the recording swaps.
    with envwatch.recording(reads, written, "third"):
        os.getenv(P + "GETENV")
    assert reads[P + "GETENV"] == (None, "third") and type(os.environ) is os._Environ


def test_nothing_is_recorded_where_someone_replaced_the_environs_class(environ):
    class Theirs(os._Environ):
        pass

    environ.__class__ = Theirs
    reads: envwatch.Reads = {}
    with envwatch.recording(reads, {}, "m", environ):
        environ.get(P + "SEEN")
    assert reads == {} and type(environ) is Theirs
    envwatch.adopt({P + "SEEN": ("0", "m")}, {}, {}, environ)
    assert type(environ) is Theirs and builtins.__import__ is IMPORT and envwatch.Judged.environ is None


def test_only_what_the_script_set_is_warned_about_once_per_variable(environ, capsys):
    """A key is the script's when its value differs from what the launch gave, what the preload saw and what
    the preload wrote. The launcher's own values (a rank number the replacement standby did not know) and the
    preload's write (inductor's cache directory, left in the rank's environment by a preload still running at
    the hand-over) are not."""
    reads = {P + "SEEN": ("1", "torch._dynamo"), P + "VERBOSE": (None, "torch._dynamo"),
             P + "CACHE": (None, "torch._dynamo"), P + "RANK": ("0", "torch._dynamo")}
    written = {P + "CACHE": "/tmp/cache"}
    launch = {P + "SEEN": "1", P + "RANK": "1"}
    environ[P + "RANK"] = "1"  # the rank's environment, as the launch gave it
    environ[P + "CACHE"] = "/tmp/cache"  # the preload's own write
    envwatch.adopt(reads, written, launch, environ)
    envwatch.settle()
    assert capsys.readouterr().err == ""
    # The script's writes: the values the launch gave or the preload saw, and unrelated variables, are fine.
    environ[P + "SEEN"] = "1"
    environ[P + "UNRELATED"] = "x"
    environ[P + "RANK"] = "0"  # what the preload saw: the preloaded module read this very value
    envwatch.settle()
    assert capsys.readouterr().err == ""
    # Another value: one line naming the variable and the module, with what to do; once per variable.
    environ[P + "VERBOSE"] = "1"
    envwatch.settle()
    environ[P + "VERBOSE"] = "2"
    envwatch.settle()
    err = capsys.readouterr().err.splitlines()
    assert err == [envwatch.warning([P + "VERBOSE"], ["torch._dynamo"])]
    assert err[0] == (f"mbr-launch: warm standby: torch._dynamo was imported before this script ran "
                      f"(--standby-preload), so {P}VERBOSE, set by the script, may have no effect on it; set it "
                      "in the launch environment instead, or run with --standby-preload none")
    # A deletion counts where every key is judged (at exit), not where only present keys are (first use).
    del environ[P + "SEEN"]
    envwatch.settle(present_only=True)
    assert capsys.readouterr().err == ""
    envwatch.settle()
    assert capsys.readouterr().err.splitlines() == [envwatch.warning([P + "SEEN"], ["torch._dynamo"])]
    assert envwatch.reported == {P + "VERBOSE", P + "SEEN"}
    # The environment still behaves as os.environ does.
    environ[P + "NEW"] = "v"
    assert environ[P + "NEW"] == "v" and dict(environ)[P + "NEW"] == "v" and (P + "NEW") in environ
    with pytest.raises(KeyError):
        del environ[P + "NOT_THERE"]


def test_a_preload_that_read_nothing_leaves_the_environ_alone(environ):
    envwatch.adopt({}, {}, {}, environ)
    assert type(environ) is os._Environ and builtins.__import__ is IMPORT


def test_a_clear_and_restore_says_nothing_wherever_it_is_judged_and_changes_come_in_one_line(environ, capsys):
    """Hugging Face accelerate's ``clear_environment()``: ``os.environ.clear()``, then the saved values back.
    Judged in the middle (a preloaded module imported inside the clear: keys present only) or after: nothing
    to say. A script that changes several variables at once gets one line naming them all."""
    reads = {P + "SEEN": ("1", "torch._dynamo"), P + "DEBUG": ("0", "torch._inductor"),
             P + "VERBOSE": (None, "torch._dynamo")}
    environ[P + "DEBUG"] = "0"
    envwatch.adopt(reads, {}, dict(environ), environ)
    saved = dict(environ)
    environ.clear()
    assert (P + "SEEN") not in environ
    envwatch.settle(present_only=True)
    environ.update(saved)
    envwatch.settle()
    assert capsys.readouterr().err == ""
    environ.update({P + "SEEN": "2", P + "DEBUG": "1", P + "VERBOSE": "1"})
    envwatch.settle()
    keys = [P + "DEBUG", P + "SEEN", P + "VERBOSE"]
    assert capsys.readouterr().err.splitlines() == [envwatch.warning(keys, ["torch._dynamo", "torch._inductor"])]


def test_the_first_import_of_a_preloaded_module_judges_and_the_hook_goes(environ, capsys):
    """Where a fresh process would read the variables: the first import statement naming the preloaded module
    or one under it (``from pkg import mod`` too). Imports of other modules pass through untouched."""
    sys.modules.pop("wave", None)
    envwatch.adopt({P + "VERBOSE": (None, "wave")}, {}, dict(environ), environ)
    assert builtins.__import__ is not IMPORT
    environ[P + "VERBOSE"] = "1"
    import json  # noqa: F401  (not preloaded: nothing judged)
    assert capsys.readouterr().err == "" and builtins.__import__ is not IMPORT
    import wave  # noqa: F401
    assert capsys.readouterr().err.splitlines() == [envwatch.warning([P + "VERBOSE"], ["wave"])]
    assert builtins.__import__ is IMPORT


@pytest.mark.parametrize("name, fromlist, found", [
    ("torch._dynamo", (), True), ("torch._dynamo.config", (), True), ("torch", ("_dynamo",), True),
    ("torch", ("nn", "_dynamo"), True), ("torch", (), False), ("torch._dynamo_x", (), False),
    ("torch", ("nn",), False), ("torch", None, False)])
def test_which_imports_name_a_preloaded_module(name, fromlist, found):
    assert envwatch._preloaded(name, fromlist, {"torch._dynamo"}) is found


def test_import_time_variables_warned_at_import_torch_are_only_the_scripts(monkeypatch, capsys):
    """``--standby torch``: at the script's ``import torch``, a variable torch reads at import is the script's
    when it differs from what the launch gave and from what torch was imported with, and is not the preload's
    own write (inductor's cache directory, put in the rank's environment by a preload still running at the
    hand-over: warned in 5 of 10 launches on 16 cores)."""
    from mbr_launch.shim import standby

    written = {"TORCHINDUCTOR_CACHE_DIR": "/tmp/torchinductor_x"}
    for key in ("KMP_BLOCKTIME", "TORCHINDUCTOR_CACHE_DIR", "TORCH_LAUNCHER_DECIDED"):
        monkeypatch.delenv(key, raising=False)
    startup = dict(os.environ)  # what this process has (CI sets TORCH_HOME and others) is the launch's too
    launch = {**startup, "TORCH_LAUNCHER_DECIDED": "1"}  # the launcher's, not in the standby's start
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/tmp/torchinductor_x")
    monkeypatch.setenv("TORCH_LAUNCHER_DECIDED", "1")
    standby._reconcile(startup, launch, written, "torch")
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("KMP_BLOCKTIME", "7")  # the script's, before its import torch
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/elsewhere")  # the script's too: another value
    standby._reconcile(startup, launch, written, "torch")
    err = capsys.readouterr().err
    assert "KMP_BLOCKTIME, TORCHINDUCTOR_CACHE_DIR set before `import torch` may have no effect" in err, err
    assert "TORCH_LAUNCHER_DECIDED" not in err
