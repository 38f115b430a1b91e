"""A reader for the data-only pickles Flight Recorder writes, bounded for pickles a neighbour crafted.

Why not ``pickle.Unpickler`` with every global refused: it runs no code, but its cost is the attacker's to
choose. It builds dicts with any hashable key, and an int hashes to itself modulo 2**61-1: a 260 KB pickle whose keys all hash alike took 2 s of CPU, one of 1 MB half a
minute (every insert probes all the keys before it), and in C, where nothing can interrupt it. So this
reader (``mbr_launch.unpickle``'s stack machine, under the ``DUMP`` policy here) takes:
- only the opcodes a dump is made of (torch's pickler writes protocol 2, Python's, in tests, 4 and 5):
  None, booleans, ints, floats, strings, lists, tuples, dicts, marks, the memo. Anything else ends the read:
  globals, reduce and build (code), sets (hashes), bytes, persistent ids;
- strings as dict keys, nothing else: a str hash is keyed by a per-process secret, nobody can make many
  collide;
- at most ``max_ops`` opcodes (each makes at most one object: memory stays about 70 bytes an opcode), and
  no time past ``deadline``.
"""

from __future__ import annotations

from typing import Any

from mbr_launch.unpickle.machine import load
from mbr_launch.unpickle.policy import DATA_OPCODES, STACK_OPCODES, PicklePolicy, PickleRefused

# What a dump is made of; ``max_ops`` is the caller's (``loads``).
DUMP = PicklePolicy(what="data-only pickle", opcodes=DATA_OPCODES | STACK_OPCODES,
              unaccepted="is not data (a global, a set, bytes, ...)", max_ops=0, keys_why="a dump's keys are strings")


class NotData(ValueError):
    """Not a whole data-only pickle within the bounds; the message says what was wrong."""


def loads(data: bytes, *, max_ops: int, deadline: float | None = None) -> Any:
    """The object in ``data``; raises ``NotData`` for anything else, never another exception."""
    try:
        return load(data, DUMP, max_ops=max_ops, deadline=deadline)
    except PickleRefused as err:
        raise NotData(str(err)) from None


__all__ = ["DUMP", "NotData", "loads"]
