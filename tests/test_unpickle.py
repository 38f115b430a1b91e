"""``mbr_launch.unpickle``, alone, under its two policies: the Flight Recorder dump's (``flightrec.DUMP``: data
only, string keys) and the rank monitor's client frames (``protocol.FRAMES``: allowed classes as inert records,
sets, bytes, protocols 0 to 5). What each accepts, and that a forbidden global is refused under each without
running anything. Pure: pickles made here, read here."""

from __future__ import annotations

import dataclasses
import os
import pickle
import struct

import pytest

from mbr_launch.monitor.protocol import FRAMES
from mbr_launch.unpickle.machine import load
from mbr_launch.unpickle.objects import Global, Record
from mbr_launch.unpickle.policy import PickleRefused
from mbr_launch.workers.flightrec import DUMP, NotData, loads

pytestmark = pytest.mark.timeout(30)
DATA = {"pg_status": {"0": {"last_enqueued_collective": 3}}, "entries": [{"time": 1.5, "ok": True, "n": None,
                                                                          "sizes": [(1, 2), (3,)], "big": 1 << 70}]}


class _Evil:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


@pytest.mark.parametrize("proto", [2, 3, 4, 5])
def test_plain_data_reads_the_same_under_both_policies(proto):
    raw = pickle.dumps(DATA, protocol=proto)
    assert load(raw, DUMP, max_ops=10_000) == DATA == load(raw, FRAMES)
    assert loads(raw, max_ops=10_000) == DATA


@pytest.mark.parametrize("policy", [DUMP, FRAMES], ids=["dump", "frames"])
@pytest.mark.parametrize("proto", [0, 2, 4])
def test_a_forbidden_global_is_refused_without_running(tmp_path, policy, proto):
    marker = tmp_path / "pwned"
    raw = pickle.dumps(_Evil(str(marker)), protocol=proto)
    with pytest.raises(PickleRefused) as caught:
        load(raw, policy, max_ops=10_000)
    # the frames' policy resolves the name and refuses it; the dump's refuses any global opcode at all
    why = "refused to unpickle global posix.system" if policy is FRAMES else "is not data (a global"
    assert why in str(caught.value)
    assert not marker.exists()


def test_an_allowed_class_is_a_record_and_never_built():
    raw = pickle.dumps(Global("m", "n"), protocol=4)  # NEWOBJ + BUILD of a class from this module's package
    with pytest.raises(PickleRefused, match="refused to unpickle global mbr_launch.unpickle.objects.Global"):
        load(raw, FRAMES)
    policy = dataclasses.replace(FRAMES, globals=frozenset({("mbr_launch.unpickle.objects", "Global")}))
    record = load(raw, policy)
    assert isinstance(record, Record) and record.cls == Global("mbr_launch.unpickle.objects", "Global")
    with pytest.raises(PickleRefused, match="is not data"):
        load(raw, DUMP, max_ops=100)  # the dump's policy takes no class, allowed or not


def test_sets_and_bytes_are_the_frames_alone():
    for value in ({1, 2}, frozenset({"a"}), b"raw"):
        raw = pickle.dumps(value, protocol=4)
        assert load(raw, FRAMES) == value
        with pytest.raises(PickleRefused, match="is not data"):
            load(raw, DUMP, max_ops=100)


def test_keys_each_policy_accepts():
    raw = pickle.dumps({7: "x"}, protocol=2)
    assert load(raw, FRAMES) == {7: "x"}
    with pytest.raises(NotData, match="a dict key of type int \\(a dump's keys are strings\\)"):
        loads(raw, max_ops=100)


def test_bounds_of_each_policy():
    flood = b"\x80\x04]" + b"Na" * 30_000 + b"."
    with pytest.raises(PickleRefused, match="more than 20000 opcodes"):
        load(flood, FRAMES)
    with pytest.raises(NotData, match="more than 1000 opcodes"):
        loads(flood, max_ops=1000)
    assert len(loads(flood, max_ops=70_000)) == 30_000  # a dump has no depth or value bound, only its opcodes
    deep = b"\x80\x04" + b"]" * 100 + b"a" * 99 + b"."
    with pytest.raises(PickleRefused, match="nested deeper than 16"):
        load(deep, FRAMES)
    with pytest.raises(NotData, match="not read in the time left"):
        loads(b"\x80\x02]" + b"N" * 10_000, max_ops=1 << 20, deadline=0.0)


def test_what_no_policy_accepts():
    for raw, why in ((b"\x80\x06N.", "pickle protocol 6"), (b"\x80\x02N", "not a whole"),
                     (b"\x80\x02(a.", "not a whole"), (b"\x80\x02h\x05.", "memo key"),
                     (b"\x80\x02NN.", "items left at its STOP"), (b"\x80\x02]N(a.", "a pop past a MARK")):
        for policy in (DUMP, FRAMES):
            with pytest.raises(PickleRefused, match=why):
                load(raw, policy, max_ops=100)
    huge = b"\x80\x02\x8b" + struct.pack("<i", 300) + b"\x01" * 300 + b"."  # LONG4 of 2400 bits
    with pytest.raises(PickleRefused, match="integer too large"):
        load(huge, FRAMES)
    with pytest.raises(PickleRefused, match="BUILD is accepted only once"):
        load(b"\x80\x02]Nb.", FRAMES)
