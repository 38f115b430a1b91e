"""The restricted reader's loop: a pickle run opcode by opcode under a ``PicklePolicy``, the opcodes of a dump first."""

from __future__ import annotations

import struct
import time
from typing import Any

from mbr_launch.unpickle.objects import check_shape, more
from mbr_launch.unpickle.policy import (APPEND, APPENDS, BINFLOAT, BINGET, BININT, BININT1, BININT2, BINPUT,
                                        BINUNICODE, BINUNICODE8, DICT, DUP, EMPTY_DICT, EMPTY_LIST, EMPTY_TUPLE,
                                        FRAME, FROZENSET, LIST, LONG1, LONG_BINGET, LONG_BINPUT, MARK, MEMOIZE,
                                        NEWFALSE, NEWTRUE, NONE, PAST_MARK, POP, POP_MARK, PROTO, SETITEM, SETITEMS,
                                        SHORT_BINUNICODE, STOP, TUPLE, TUPLE1, TUPLE2, TUPLE3, PickleBroken,
                                        PicklePolicy, PickleRefused, above, members, pop_mark, setitems, take,
                                        target_of, top)

_CHECK_EVERY = 0x1000  # opcodes between two looks at the clock
_CONSTANTS = {NONE: None, NEWTRUE: True, NEWFALSE: False, EMPTY_TUPLE: ()}  # immutable: shared safely


def load(data: bytes, policy: PicklePolicy, *, max_ops: int | None = None, deadline: float | None = None) -> Any:
    """The value in ``data`` as plain containers, scalars, ``Global`` names and ``Record`` objects; raises only
    ``PickleRefused``: for anything ``policy`` does not accept, or not read by ``deadline``."""
    try:
        value = _run(data, policy, policy.max_ops if max_ops is None else max_ops, deadline)
    except PickleRefused:
        raise
    except PickleBroken as err:
        raise PickleRefused(f"not a whole {policy.what} ({err})") from None
    except KeyError:
        raise PickleRefused(f"not a whole {policy.what} (a memo key that is not set)") from None
    except Exception as err:  # the data cut short, bad UTF-8, a target of the wrong type: a stack machine's bugs
        raise PickleRefused(f"not a whole {policy.what} ({type(err).__name__})") from None
    if policy.max_depth is not None:
        check_shape(value, policy.max_depth, policy.max_values)
    return value


def _run(data: bytes, policy: PicklePolicy, max_ops: int, deadline: float | None) -> Any:
    stack: list[Any] = []
    marks: list[int] = []
    floor = 0  # the stack below the last MARK is not to be popped until the MARK is
    memo: dict[Any, Any] = {}
    accept, unpack, push = policy.accept, struct.unpack_from, stack.append
    i, ops, check_at = 0, 0, min(_CHECK_EVERY, max_ops + 1)
    while True:
        op = data[i]  # IndexError past the end: a pickle without its STOP
        i += 1
        ops += 1
        if ops >= check_at:
            if ops > max_ops:
                raise PickleRefused(f"more than {max_ops} opcodes")
            if deadline is not None and time.monotonic() > deadline:
                raise PickleRefused("not read in the time left")
            check_at = min(ops + _CHECK_EVERY, max_ops + 1)
        if not accept[op]:
            raise PickleRefused(f"opcode {op:#04x} at byte {i - 1} {policy.unaccepted}")
        if op == BINGET:
            push(memo[data[i]])
            i += 1
        elif op == MARK:
            floor = len(stack)
            marks.append(floor)
        elif op == EMPTY_LIST:
            push([])
        elif op == APPENDS:
            k, floor = pop_mark(marks)
            target_of(stack, k, floor, list).extend(stack[k:])
            del stack[k:]
        elif op == BININT2:
            push(data[i] | data[i + 1] << 8)
            i += 2
        elif op == BININT1:
            push(data[i])
            i += 1
        elif op in _CONSTANTS:
            push(_CONSTANTS[op])
        elif op == EMPTY_DICT:
            push({})
        elif op == SETITEMS:
            k, floor = pop_mark(marks)
            setitems(target_of(stack, k, floor, dict), stack, k, policy)
            del stack[k:]
        elif op == BININT:
            push(unpack("<i", data, i)[0])
            i += 4
        elif op == TUPLE2:
            if len(stack) - 2 < floor:
                raise PickleBroken(PAST_MARK)
            stack[-2:] = [(stack[-2], stack[-1])]
        elif op == LONG1:
            n = data[i]
            push(int.from_bytes(take(data, i + 1, n), "little", signed=True))
            i += 1 + n
        elif op == BINPUT:
            if len(stack) <= floor:
                raise PickleBroken(PAST_MARK)
            memo[data[i]] = stack[-1]
            i += 1
        elif op in (BINUNICODE, SHORT_BINUNICODE, BINUNICODE8):
            width = 4 if op == BINUNICODE else 1 if op == SHORT_BINUNICODE else 8
            n = int.from_bytes(take(data, i, width), "little")
            i += width
            push(take(data, i, n).decode("utf-8", "surrogatepass"))
            i += n
        elif op == MEMOIZE:
            if len(stack) <= floor:
                raise PickleBroken(PAST_MARK)
            memo[len(memo)] = stack[-1]
        elif op == FRAME:
            i += 8  # a frame only tells the writer's buffering
        elif op == PROTO:
            if data[i] > 5:
                raise PickleRefused(f"pickle protocol {data[i]}")
            i += 1
        elif op == STOP:
            if len(stack) != 1 or marks:
                raise PickleBroken("items left at its STOP")
            return stack[0]
        elif op == APPEND:
            if len(stack) - 1 <= floor:  # the item, and the list below it
                raise PickleBroken(PAST_MARK)
            item = stack.pop()
            target_of(stack, len(stack), floor, list).append(item)
        elif op == SETITEM:
            if len(stack) - 2 < floor:
                raise PickleBroken(PAST_MARK)
            setitems(target_of(stack, len(stack) - 2, floor, dict), stack, len(stack) - 2, policy)
            del stack[-2:]
        elif op == TUPLE1:
            above(stack, 1, floor)
            stack[-1] = (stack[-1],)
        elif op == TUPLE3:
            above(stack, 3, floor)
            stack[-3:] = [(stack[-3], stack[-2], stack[-1])]
        elif op in (TUPLE, LIST, FROZENSET):
            k, floor = pop_mark(marks)
            items = stack[k:]
            del stack[k:]
            push(tuple(items) if op == TUPLE else items if op == LIST else frozenset(members(items, policy)))
        elif op == DICT:
            k, floor = pop_mark(marks)
            target: dict[Any, Any] = {}
            setitems(target, stack, k, policy)
            del stack[k:]
            push(target)
        elif op == BINFLOAT:
            push(unpack(">d", data, i)[0])
            i += 8
        elif op == LONG_BINPUT:
            memo[unpack("<I", data, i)[0]] = top(stack, floor)
            i += 4
        elif op == LONG_BINGET:
            push(memo[unpack("<I", data, i)[0]])
            i += 4
        elif op == POP:
            above(stack, 1, floor)
            stack.pop()
        elif op == POP_MARK:
            k, floor = pop_mark(marks)
            del stack[k:]
        elif op == DUP:
            push(top(stack, floor))
        else:
            i = more(op, data, i, stack, marks, memo, policy)
            floor = marks[-1] if marks else 0
