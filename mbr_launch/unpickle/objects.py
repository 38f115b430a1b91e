"""What no Flight Recorder dump holds, read for a policy that accepts it: globals as ``Global`` names, objects
as inert ``Record``s (NVRx's dataclasses and enums read as records), sets, bytes, and protocol 0's text forms;
and the shape bound on the value read. Nothing is imported, called or mutated outside the frame.
"""

from __future__ import annotations

import codecs
import struct
from dataclasses import dataclass
from typing import Any, Collection

from mbr_launch.unpickle.policy import (ADDITEMS, BINBYTES, BINBYTES8, BUILD, EMPTY_SET, FLOAT, GET, GLOBAL, INT,
                                        LONG, LONG4, NEWOBJ, NEWOBJ_EX, PUT, REDUCE, SHORT_BINBYTES, STACK_GLOBAL,
                                        PickleBroken, PicklePolicy, PickleRefused, above, bounded, members, pop_mark,
                                        take, target_of, top)

_SETS = ("builtins", "set"), ("builtins", "frozenset")


@dataclass(frozen=True)
class Global:
    module: str
    name: str


class Record:
    """What NEWOBJ/REDUCE would have built: the class's name, its arguments, and BUILD's state."""

    __slots__ = ("cls", "args", "state", "built")

    def __init__(self, cls: Global, args: tuple) -> None:
        self.cls = cls
        self.args = args
        self.state: Any = None
        self.built = False

    def __repr__(self) -> str:
        return f"Record({self.cls.name}, args={self.args!r}, state={self.state!r})"


def more(op: int, data: bytes, i: int, stack: list[Any], marks: list[int], memo: dict[Any, Any],
         policy: PicklePolicy) -> int:
    """The opcodes no dump holds: objects, sets, bytes, the text forms. Returns the next opcode's offset."""
    floor = marks[-1] if marks else 0
    if op in (SHORT_BINBYTES, BINBYTES, BINBYTES8):
        width = 1 if op == SHORT_BINBYTES else 4 if op == BINBYTES else 8
        n = int.from_bytes(take(data, i, width), "little")
        stack.append(take(data, i + width, n))
        return i + width + n
    if op == LONG4:
        n = struct.unpack_from("<i", data, i)[0]
        if n < 0:
            raise PickleBroken(f"a LONG4 of {n} bytes")
        stack.append(bounded(int.from_bytes(take(data, i + 4, n), "little", signed=True), policy))
        return i + 4 + n
    if op == EMPTY_SET:
        stack.append(set())
    elif op == ADDITEMS:
        k, below = pop_mark(marks)
        target_of(stack, k, below, set).update(members(stack[k:], policy))
        del stack[k:]
    elif op == STACK_GLOBAL:
        above(stack, 2, floor)
        name, module = stack.pop(), stack.pop()
        stack.append(_resolve(module, name, policy))
    elif op in (NEWOBJ, REDUCE):
        above(stack, 2, floor)
        args, cls = stack.pop(), stack.pop()
        stack.append(_set_of(args, policy) if op == REDUCE and isinstance(cls, Global) and
                     (cls.module, cls.name) in _SETS else _record(cls, args))
    elif op == NEWOBJ_EX:
        above(stack, 3, floor)
        kwargs, args, cls = stack.pop(), stack.pop(), stack.pop()
        if type(kwargs) is not dict or kwargs:
            raise PickleRefused("NEWOBJ_EX with keyword arguments")
        stack.append(_record(cls, args))
    elif op == BUILD:
        above(stack, 2, floor)
        state, target = stack.pop(), stack[-1]
        if type(target) is not Record or target.built:
            raise PickleRefused("BUILD is accepted only once, on an object this frame made")
        target.state, target.built = state, True
    else:  # the text forms, each a line (GLOBAL: two)
        end = data.index(b"\n", i)  # ValueError without one
        line = data[i:end]
        if op == GLOBAL:
            second = data.index(b"\n", end + 1)
            module, name = (codecs.escape_decode(part)[0].decode("ascii") for part in (line, data[end + 1:second]))
            stack.append(_resolve(module, name, policy))
            return second + 1
        if op in (INT, PUT, GET):  # protocol 0's "I01"/"I00" are True/False
            number: Any = True if line == b"01" else False if line == b"00" else int(line)
            if op == PUT:
                memo[number] = top(stack, floor)
            else:
                stack.append(memo[number] if op == GET else bounded(number, policy))
        elif op == LONG:
            stack.append(bounded(int(line[:-1] if line.endswith(b"L") else line), policy))
        elif op == FLOAT:
            stack.append(float(line))
        else:  # UNICODE
            stack.append(str(line, "raw-unicode-escape"))
        return end + 1
    return i


def _resolve(module: Any, name: Any, policy: PicklePolicy) -> Global:
    if module == "__builtin__":  # protocols 0-2 write Python 2's name (``pickle`` maps it back too)
        module = "builtins"
    if (module, name) not in policy.globals:
        raise PickleRefused(f"refused to unpickle global {module}.{name}")
    return Global(module, name)


def _record(cls: Any, args: Any) -> Record:
    if not isinstance(cls, Global) or type(args) is not tuple:
        raise PickleRefused("object construction from something other than an allowed class")
    return Record(cls, args)


def _set_of(args: Any, policy: PicklePolicy) -> frozenset[Any]:
    """Protocols 2 and 3 pickle a set as set([items]): read as a plain frozenset."""
    if args == ():
        return frozenset()
    if not (type(args) is tuple and len(args) == 1 and type(args[0]) in (list, tuple)):
        raise PickleRefused("set() with odd arguments")
    return frozenset(members(list(args[0]), policy))


_LEAVES = (str, bytes, int, float, bool, type(None), Global)


def _children(value: Any) -> Collection[Any]:
    if isinstance(value, _LEAVES):
        return ()
    if isinstance(value, dict):
        return [*value.keys(), *value.values()]
    if isinstance(value, Record):
        return [*value.args, value.state]
    return value  # list, tuple, set, frozenset


def check_shape(root: Any, max_depth: int, max_values: int) -> None:
    """Refuse values nested deeper than ``max_depth`` or made of more than ``max_values`` values."""
    todo = [(root, 1)]
    seen = 0
    while todo:
        value, depth = todo.pop()
        seen += 1
        if depth > max_depth:
            raise PickleRefused(f"nested deeper than {max_depth}")
        if seen > max_values:
            raise PickleRefused(f"more than {max_values} values")
        todo.extend((child, depth + 1) for child in _children(value))
