"""A reader for the data-only pickles Flight Recorder writes, bounded for pickles a neighbour crafted.

Why not ``pickle.Unpickler`` with every global refused: it runs no code, but its cost is the attacker's to
choose. It builds dicts with any hashable key, and an int hashes to itself modulo 2**61-1: a 260 KB pickle
whose keys all hash alike took 2 s of CPU, one of 1 MB half a minute (every insert probes all the keys before
it), and in C, where nothing can interrupt it. So this reader, in Python, takes:
- only the opcodes a dump is made of (torch's pickler writes protocol 2, Python's, in tests, 4 and 5):
  None, booleans, ints, floats, strings, lists, tuples, dicts, marks, the memo. Anything else ends the read:
  globals, reduce and build (code), sets (hashes), bytes, persistent ids;
- strings as dict keys, nothing else: a str hash is keyed by a per-process secret, nobody can make many
  collide;
- at most ``max_ops`` opcodes (each makes at most one object: memory stays about 70 bytes an opcode), and
  no time past ``deadline``.
"""

from __future__ import annotations

import struct
import time
from typing import Any

# Opcodes (pickletools names them); the frequent ones of a real dump are tested first.
BINGET, MARK, EMPTY_LIST, APPENDS, BININT2, BININT1, NONE = 0x68, 0x28, 0x5D, 0x65, 0x4D, 0x4B, 0x4E
EMPTY_DICT, SETITEMS, BININT, TUPLE2, LONG1, NEWTRUE, NEWFALSE = 0x7D, 0x75, 0x4A, 0x86, 0x8A, 0x88, 0x89
BINPUT, BINUNICODE, MEMOIZE, SHORT_BINUNICODE, FRAME, PROTO, STOP = 0x71, 0x58, 0x94, 0x8C, 0x95, 0x80, 0x2E
APPEND, SETITEM, TUPLE1, TUPLE3, TUPLE, EMPTY_TUPLE, LIST, DICT = 0x61, 0x73, 0x85, 0x87, 0x74, 0x29, 0x6C, 0x64
BINFLOAT, BINUNICODE8, LONG_BINPUT, LONG_BINGET, POP, POP_MARK, DUP = 0x47, 0x8D, 0x72, 0x6A, 0x30, 0x31, 0x32

_CHECK_EVERY = 0xFFF  # opcodes between two looks at the budget and the clock


class NotData(ValueError):
    """Not a whole data-only pickle within the bounds; the message says what was wrong."""


def loads(data: bytes, *, max_ops: int, deadline: float | None = None) -> Any:
    """The object in ``data``; raises ``NotData`` for anything else, never another exception."""
    try:
        return _loads(data, max_ops, deadline)
    except NotData:
        raise
    except (IndexError, KeyError, TypeError, AttributeError, ValueError, struct.error, RecursionError) as err:
        # a stack or memo that is not there, a target of the wrong type, bad UTF-8, the data cut short
        raise NotData(f"not a whole data-only pickle ({type(err).__name__})") from None


def _loads(data: bytes, max_ops: int, deadline: float | None) -> Any:
    stack: list[Any] = []
    marks: list[int] = []
    memo: dict[int, Any] = {}
    unpack = struct.unpack_from
    push = stack.append
    i, ops = 0, 0
    while True:
        op = data[i]  # IndexError past the end: a pickle without its STOP
        i += 1
        ops += 1
        if not ops & _CHECK_EVERY:
            if ops > max_ops:
                raise NotData(f"more than {max_ops} opcodes")
            if deadline is not None and time.monotonic() > deadline:
                raise NotData("not read in the time left")
        if op == BINGET:
            push(memo[data[i]])
            i += 1
        elif op == MARK:
            marks.append(len(stack))
        elif op == EMPTY_LIST:
            push([])
        elif op == APPENDS:
            k = _below(marks.pop())
            _list(stack[k - 1]).extend(stack[k:])
            del stack[k:]
        elif op == BININT2:
            push(data[i] | data[i + 1] << 8)
            i += 2
        elif op == BININT1:
            push(data[i])
            i += 1
        elif op == NONE:
            push(None)
        elif op == EMPTY_DICT:
            push({})
        elif op == SETITEMS:
            k = _below(marks.pop())
            _setitems(stack[k - 1], stack, k)
            del stack[k:]
        elif op == BININT:
            push(unpack("<i", data, i)[0])
            i += 4
        elif op == TUPLE2:
            stack[-2:] = [(stack[-2], stack[-1])]
        elif op == LONG1:
            n = data[i]
            push(int.from_bytes(_take(data, i + 1, n), "little", signed=True))
            i += 1 + n
        elif op == NEWTRUE:
            push(True)
        elif op == NEWFALSE:
            push(False)
        elif op == BINPUT:
            memo[data[i]] = stack[-1]
            i += 1
        elif op in (BINUNICODE, SHORT_BINUNICODE, BINUNICODE8):
            width = 4 if op == BINUNICODE else 1 if op == SHORT_BINUNICODE else 8
            n = int.from_bytes(_take(data, i, width), "little")
            i += width
            push(_take(data, i, n).decode("utf-8", "surrogatepass"))
            i += n
        elif op == MEMOIZE:
            memo[len(memo)] = stack[-1]
        elif op == FRAME:
            i += 8  # a frame only tells the writer's buffering
        elif op == PROTO:
            i += 1
        elif op == STOP:
            if len(stack) != 1 or marks:
                raise NotData("not a whole data-only pickle (items left at its STOP)")
            return stack[0]
        elif op == APPEND:
            item = stack.pop()
            _list(stack[-1]).append(item)
        elif op == SETITEM:
            _setitems(stack[-3], stack, len(stack) - 2)
            del stack[-2:]
        elif op == TUPLE1:
            stack[-1] = (stack[-1],)
        elif op == TUPLE3:
            stack[-3:] = [(stack[-3], stack[-2], stack[-1])]
        elif op == TUPLE or op == LIST:
            k = marks.pop()
            items = stack[k:]
            del stack[k:]
            push(tuple(items) if op == TUPLE else items)
        elif op == EMPTY_TUPLE:
            push(())
        elif op == DICT:
            k = marks.pop()
            target: dict[str, Any] = {}
            _setitems(target, stack, k)
            del stack[k:]
            push(target)
        elif op == BINFLOAT:
            push(unpack(">d", data, i)[0])
            i += 8
        elif op == LONG_BINPUT:
            memo[unpack("<I", data, i)[0]] = stack[-1]
            i += 4
        elif op == LONG_BINGET:
            push(memo[unpack("<I", data, i)[0]])
            i += 4
        elif op == POP:
            stack.pop()
        elif op == POP_MARK:
            del stack[marks.pop():]
        elif op == DUP:
            push(stack[-1])
        else:
            raise NotData(f"opcode {op:#04x} at byte {i - 1} is not data (a global, a set, bytes, ...)")


def _take(data: bytes, start: int, n: int) -> bytes:
    piece = data[start:start + n]
    if len(piece) != n:
        raise NotData("not a whole data-only pickle (cut short)")
    return piece


def _below(mark: int) -> int:
    """A mark with the target of APPENDS or SETITEMS below it (``stack[-1]`` would be the last item)."""
    if mark < 1:
        raise NotData("not a whole data-only pickle (nothing below a mark)")
    return mark


def _list(target: Any) -> list[Any]:
    if type(target) is not list:
        raise NotData("not a whole data-only pickle (appending to something not a list)")
    return target


def _setitems(target: Any, stack: list[Any], k: int) -> None:
    """Items ``stack[k:]`` (key, value, key, value, ...) into the dict ``target``; a key that is not a string
    ends the read before any key is hashed."""
    if type(target) is not dict:
        raise NotData("not a whole data-only pickle (setting items on something not a dict)")
    keys, values = stack[k::2], stack[k + 1::2]
    if len(keys) != len(values):
        raise NotData("not a whole data-only pickle (a key without its value)")
    kinds = set(map(type, keys))
    if not kinds <= {str}:
        raise NotData(f"a dict key of type {next(t for t in kinds if t is not str).__name__} (a dump's keys are "
                      "strings)")
    target.update(zip(keys, values))
