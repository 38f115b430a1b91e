"""What a standby's extra preload read from the environment, and the warnings after the hand-over
(``mbr_launch.shim.envwatch``): pure, on a private ``os._Environ`` (its writes reach the process's C
environment under names no one else uses, removed afterwards) and, for ``os.getenv``, on ``os.environ``."""

from __future__ import annotations

import os
import time

import pytest

from mbr_launch.shim import envwatch

pytestmark = pytest.mark.timeout(30)

P = "MBR_ENVWATCH_TEST_"


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
    envwatch.Watching.watched, envwatch.Watching.environ = {}, None


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
    envwatch.adopt({P + "SEEN": ("0", "m")}, {}, environ)
    assert type(environ) is Theirs


def test_after_the_hand_over_changes_warn_once_per_variable(environ, capsys):
    reads = {P + "SEEN": ("1", "torch._dynamo"), P + "VERBOSE": (None, "torch._dynamo"),
             P + "CACHE": (None, "torch._dynamo"), P + "RANK": ("0", "torch._dynamo")}
    written = {P + "CACHE": "/tmp/cache"}
    environ[P + "RANK"] = "1"  # the rank's environment differs from what the preload saw
    envwatch.adopt(reads, written, environ)
    assert (P + "CACHE") not in environ  # the script's first line sees what a fresh process's does
    err = capsys.readouterr().err.splitlines()
    assert err == [envwatch.warning([P + "RANK"], ["torch._dynamo"], by_script=False)]
    assert f"so {P}RANK, as this rank's environment has it, may have no effect on it" in err[0]
    # The script's writes: the values the preload saw or left, and unrelated variables, are fine.
    environ[P + "SEEN"] = "1"
    environ[P + "UNRELATED"] = "x"
    del environ[P + "UNRELATED"]
    environ[P + "RANK"] = "2"  # reported at the hand-over already
    envwatch.settle()
    assert capsys.readouterr().err == ""
    # Another value: one line naming the variable and the module, with what to do; once per variable.
    environ[P + "VERBOSE"] = "1"
    envwatch.settle()
    environ[P + "VERBOSE"] = "2"
    del environ[P + "VERBOSE"]
    envwatch.settle()
    err = capsys.readouterr().err.splitlines()
    assert err == [envwatch.warning([P + "VERBOSE"], ["torch._dynamo"], by_script=True)]
    assert err[0] == (f"mbr-launch: warm standby: torch._dynamo was imported before this script ran "
                      f"(--standby-preload), so {P}VERBOSE, set by the script, may have no effect on it; set it "
                      "in the launch environment instead, or run with --standby-preload none")
    del environ[P + "SEEN"]  # a deletion that stays changes it too; on the timer, as in a rank
    deadline = time.monotonic() + 10
    while not (err := capsys.readouterr().err) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert err.splitlines() == [envwatch.warning([P + "SEEN"], ["torch._dynamo"], by_script=True)]
    assert envwatch.reported == {P + "RANK", P + "VERBOSE", P + "SEEN"}
    # The watched environment still behaves as os.environ does.
    environ[P + "NEW"] = "v"
    assert environ[P + "NEW"] == "v" and dict(environ)[P + "NEW"] == "v" and (P + "NEW") in environ
    with pytest.raises(KeyError):
        del environ[P + "NOT_THERE"]


def test_a_preload_that_read_nothing_leaves_the_environ_alone(environ):
    envwatch.adopt({}, {}, environ)
    assert type(environ) is os._Environ


def test_a_clear_and_restore_that_changes_nothing_says_nothing_and_changes_come_in_one_line(environ, capsys):
    """Hugging Face accelerate's ``clear_environment()``: ``os.environ.clear()``, then the saved values back.
    Values are compared once the writes settle, not the writes themselves: nothing to say. A script that
    changes several watched variables at once gets one line naming them all."""
    reads = {P + "SEEN": ("1", "torch._dynamo"), P + "DEBUG": ("0", "torch._inductor"),
             P + "VERBOSE": (None, "torch._dynamo")}
    environ[P + "DEBUG"] = "0"
    envwatch.adopt(reads, {}, environ)
    saved = dict(environ)
    environ.clear()
    assert (P + "SEEN") not in environ
    environ.update(saved)
    envwatch.settle()
    assert capsys.readouterr().err == ""
    environ.update({P + "SEEN": "2", P + "DEBUG": "1", P + "VERBOSE": "1"})
    envwatch.settle()
    keys = [P + "DEBUG", P + "SEEN", P + "VERBOSE"]
    assert capsys.readouterr().err.splitlines() == [
        envwatch.warning(keys, ["torch._dynamo", "torch._inductor"], by_script=True)]
