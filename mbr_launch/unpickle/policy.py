"""What a restricted reader accepts (``PicklePolicy``), the opcodes it names, its refusal, and the checks the opcode
handlers share."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Collection, TypeVar

# Opcodes (pickletools names them); the frequent ones of a real dump are tested first.
BINGET, MARK, EMPTY_LIST, APPENDS, BININT2, BININT1, NONE = 0x68, 0x28, 0x5D, 0x65, 0x4D, 0x4B, 0x4E
EMPTY_DICT, SETITEMS, BININT, TUPLE2, LONG1, NEWTRUE, NEWFALSE = 0x7D, 0x75, 0x4A, 0x86, 0x8A, 0x88, 0x89
BINPUT, BINUNICODE, MEMOIZE, SHORT_BINUNICODE, FRAME, PROTO, STOP = 0x71, 0x58, 0x94, 0x8C, 0x95, 0x80, 0x2E
APPEND, SETITEM, TUPLE1, TUPLE3, TUPLE, EMPTY_TUPLE, LIST, DICT = 0x61, 0x73, 0x85, 0x87, 0x74, 0x29, 0x6C, 0x64
BINFLOAT, BINUNICODE8, LONG_BINPUT, LONG_BINGET, POP, POP_MARK, DUP = 0x47, 0x8D, 0x72, 0x6A, 0x30, 0x31, 0x32
# ... and those of objects, sets, bytes and protocol 0's text forms
GLOBAL, STACK_GLOBAL, NEWOBJ, NEWOBJ_EX, REDUCE, BUILD = 0x63, 0x93, 0x81, 0x92, 0x52, 0x62
EMPTY_SET, ADDITEMS, FROZENSET, SHORT_BINBYTES, BINBYTES, BINBYTES8 = 0x8F, 0x90, 0x91, 0x43, 0x42, 0x8E
INT, LONG, LONG4, FLOAT, UNICODE, PUT, GET = 0x49, 0x4C, 0x8B, 0x46, 0x56, 0x70, 0x67

DATA_OPCODES = frozenset({
    BINGET, MARK, EMPTY_LIST, APPENDS, BININT2, BININT1, NONE, EMPTY_DICT, SETITEMS, BININT, TUPLE2, LONG1, NEWTRUE,
    NEWFALSE, BINPUT, BINUNICODE, MEMOIZE, SHORT_BINUNICODE, FRAME, PROTO, STOP, APPEND, SETITEM, TUPLE1, TUPLE3,
    TUPLE, EMPTY_TUPLE, LIST, DICT, BINFLOAT, BINUNICODE8, LONG_BINPUT, LONG_BINGET})
STACK_OPCODES = frozenset({POP, POP_MARK, DUP})
OBJECT_OPCODES = frozenset({GLOBAL, STACK_GLOBAL, NEWOBJ, NEWOBJ_EX, REDUCE, BUILD})
SET_OPCODES = frozenset({EMPTY_SET, ADDITEMS, FROZENSET})
BYTES_OPCODES = frozenset({SHORT_BINBYTES, BINBYTES, BINBYTES8})
TEXT_OPCODES = frozenset({INT, LONG, LONG4, FLOAT, UNICODE, PUT, GET})  # LONG4: a binary one, unbounded

PAST_MARK = "a pop past a MARK"
_C = TypeVar("_C", list, dict, set)


class PickleRefused(ValueError):
    """Not a pickle the policy accepts, or not a whole one; the message says why."""


class PickleBroken(Exception):
    """Not a whole pickle: ``machine.load`` says so, with this reason."""


@dataclass(frozen=True)
class PicklePolicy:
    """What one reader accepts; anything else ends the read with ``PickleRefused``."""

    what: str  # what such a pickle is, for messages: "not a whole <what>"
    opcodes: frozenset[int]  # DATA_OPCODES and what else the reader needs
    unaccepted: str  # said of any other opcode: "opcode 0x93 at byte 2 <unaccepted>"
    max_ops: int
    keys: frozenset[type] = frozenset({str})  # dict keys and set members
    keys_why: str = "keys are strings"  # said of any other key: "a dict key of type int (<keys_why>)"
    globals: Collection[tuple[str, str]] = frozenset()  # (module, name) pairs a GLOBAL may name
    max_int_bits: int = 2048  # bounds LONG4 and the text forms (LONG1 holds 2040 bits at most)
    max_depth: int | None = None  # checked on the value read, when set, with max_values
    max_values: int = 0
    accept: bytes = field(init=False, repr=False, compare=False)  # accept[op]: 1 if accepted

    def __post_init__(self) -> None:
        object.__setattr__(self, "accept", bytes(int(op in self.opcodes) for op in range(256)))


def pop_mark(marks: list[int]) -> tuple[int, int]:
    """The last MARK's place, and the floor below it (the MARK before it)."""
    if not marks:
        raise PickleBroken("an opcode that needs a MARK without one")
    return marks.pop(), marks[-1] if marks else 0


def above(stack: list[Any], n: int, floor: int) -> None:
    if len(stack) - n < floor:
        raise PickleBroken(PAST_MARK)


def top(stack: list[Any], floor: int) -> Any:
    above(stack, 1, floor)
    return stack[-1]


def target_of(stack: list[Any], k: int, floor: int, kind: type[_C]) -> _C:
    """The target of APPEND(S), SETITEM(S) or ADDITEMS: ``stack[k - 1]``, above the ``floor``, of ``kind``."""
    if k <= floor or k < 1:
        raise PickleBroken("nothing below a mark")
    target = stack[k - 1]
    if type(target) is not kind:
        raise PickleBroken(f"adding items to something not a {kind.__name__}")
    return target


def setitems(target: dict[Any, Any], stack: list[Any], k: int, policy: PicklePolicy) -> None:
    """Items ``stack[k:]`` (key, value, key, value, ...) into ``target``; a key of a type the policy does not
    accept ends the read before any key is hashed."""
    keys, values = stack[k::2], stack[k + 1::2]
    if len(keys) != len(values):
        raise PickleBroken("a key without its value")
    target.update(zip(members(keys, policy, "a dict key", f" ({policy.keys_why})"), values))


def members(items: list[Any], policy: PicklePolicy, what: str = "a set member", why: str = "") -> list[Any]:
    """``items``, each of a type the policy accepts as a dict key or set member (checked before any is hashed)."""
    kinds = set(map(type, items))
    if not kinds <= policy.keys:
        raise PickleRefused(f"{what} of type {next(t for t in kinds if t not in policy.keys).__name__}{why}")
    return items


def bounded(number: Any, policy: PicklePolicy) -> Any:
    if type(number) is int and number.bit_length() > policy.max_int_bits:
        raise PickleRefused("integer too large")
    return number


def take(data: bytes, start: int, n: int) -> bytes:
    piece = data[start:start + n]
    if len(piece) != n:
        raise PickleBroken("cut short")
    return piece
