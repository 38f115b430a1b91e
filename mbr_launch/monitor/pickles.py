"""Pickle frames read into inert values: nothing is imported, called, or mutated outside the frame.

``pickle.Unpickler`` builds objects by calling the classes it resolves and applies BUILD (``__setstate__``
or a ``__dict__``/``setattr`` update) to whatever is on its stack. Even with an allow-list, that lets one
frame rename a shared enum member or empty an allowed class's member map inside the live monitor. So the
opcodes are parsed by ``pickletools.genops`` (which only reads) and run on a small stack machine here:

* a global becomes a ``Global`` name (only the allowed ``(module, name)`` pairs), never the real object;
* NEWOBJ / NEWOBJ_EX / REDUCE on a ``Global`` make a fresh ``Record`` (class name, arguments), and BUILD
  sets a record's state once; BUILD on anything else, a global included, is refused;
* containers are fresh Python containers; every other opcode (persistent ids, extension codes, INST/OBJ,
  ...) is refused.

NVRx 0.4.1 pickles dataclasses as NEWOBJ + BUILD(state dict) and enums as REDUCE(class, (value,)), so a
real message reads as records. The work is bounded: opcodes per frame, integer size, nesting depth and the
number of values (a shared or cyclic value counts each time it is reached, so cycles hit the bound too).
"""

from __future__ import annotations

import pickletools
from dataclasses import dataclass
from typing import Any, Callable, Collection

MAX_OPS = 20_000  # a real message has under 100; a state_dict-sized UpdateConfigMsg a few thousand
MAX_DEPTH = 16  # a real message nests 4 deep (UpdateConfigMsg -> SectionTimeouts -> dict -> value)
MAX_VALUES = 20_000
MAX_INT_BITS = 2048  # larger integers are refused outright; the validator bounds them much tighter


class Refused(Exception):
    """Not a frame this reader accepts; the message says why."""


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


_LEAVES = (str, bytes, int, float, bool, type(None), Global)


class _Machine:
    def __init__(self, allowed: Collection[tuple[str, str]]) -> None:
        self.allowed = allowed
        self.stack: list[Any] = []
        self.marks: list[int] = []
        self.memo: dict[int, Any] = {}

    def run(self, payload: bytes) -> Any:
        count = 0
        for op, arg, _pos in pickletools.genops(payload):
            count += 1
            if count > MAX_OPS:
                raise Refused(f"more than {MAX_OPS} pickle opcodes")
            if op.name == "STOP":
                if len(self.stack) != 1 or self.marks:
                    raise Refused("unbalanced pickle stack at STOP")
                return self.stack.pop()
            handler = _DISPATCH.get(op.name)
            if handler is None:
                raise Refused(f"pickle opcode {op.name} is not accepted")
            handler(self, arg)
        raise Refused("pickle without STOP")

    # ---- helpers ------------------------------------------------------------------------------------

    def push(self, value: Any) -> None:
        self.stack.append(value)

    def pop(self) -> Any:
        if not self.stack or (self.marks and len(self.stack) <= self.marks[-1]):
            raise Refused("pickle stack underflow")
        return self.stack.pop()

    def pop_mark(self) -> list[Any]:
        if not self.marks:
            raise Refused("pickle opcode needs a MARK")
        start = self.marks.pop()
        items, self.stack[start:] = self.stack[start:], []
        return items

    def top(self) -> Any:
        if not self.stack or (self.marks and len(self.stack) <= self.marks[-1]):
            raise Refused("pickle stack underflow")
        return self.stack[-1]

    def _resolve(self, module: Any, name: Any) -> Global:
        if module == "__builtin__":  # protocols 0-2 write Python 2's name (``pickle`` maps it back too)
            module = "builtins"
        if (module, name) not in self.allowed:
            raise Refused(f"refused to unpickle global {module}.{name}")
        return Global(module, name)

    # ---- framing and scalars ------------------------------------------------------------------------

    def _proto(self, arg: int) -> None:
        if arg > 5:
            raise Refused(f"pickle protocol {arg}")

    def _frame(self, arg: int) -> None:
        pass

    def _mark(self, arg: None) -> None:
        self.marks.append(len(self.stack))

    def _none(self, arg: None) -> None:
        self.push(None)

    def _newtrue(self, arg: None) -> None:
        self.push(True)

    def _newfalse(self, arg: None) -> None:
        self.push(False)

    def _int(self, arg: Any) -> None:
        if not isinstance(arg, bool) and abs(arg).bit_length() > MAX_INT_BITS:
            raise Refused("integer too large")
        self.push(arg)

    _binint = _binint1 = _binint2 = _long = _long1 = _long4 = _int

    def _binfloat(self, arg: float) -> None:
        self.push(arg)

    _float = _binfloat

    def _binunicode(self, arg: str) -> None:
        self.push(arg)

    _short_binunicode = _binunicode8 = _unicode = _binunicode
    _short_binbytes = _binbytes = _binbytes8 = _binunicode

    # ---- containers ---------------------------------------------------------------------------------

    def _empty_tuple(self, arg: None) -> None:
        self.push(())

    def _tuple(self, arg: None) -> None:
        self.push(tuple(self.pop_mark()))

    def _tuple1(self, arg: None) -> None:
        self.push((self.pop(),))

    def _tuple2(self, arg: None) -> None:
        b, a = self.pop(), self.pop()
        self.push((a, b))

    def _tuple3(self, arg: None) -> None:
        c, b, a = self.pop(), self.pop(), self.pop()
        self.push((a, b, c))

    def _empty_list(self, arg: None) -> None:
        self.push([])

    def _list(self, arg: None) -> None:
        self.push(self.pop_mark())

    def _append(self, arg: None) -> None:
        value = self.pop()
        self._list_at_top().append(value)

    def _appends(self, arg: None) -> None:
        items = self.pop_mark()
        self._list_at_top().extend(items)

    def _list_at_top(self) -> list:
        target = self.top()
        if type(target) is not list:
            raise Refused("APPEND to a non-list")
        return target

    def _empty_dict(self, arg: None) -> None:
        self.push({})

    def _dict(self, arg: None) -> None:
        self.push(self._pairs({}, self.pop_mark()))

    def _setitem(self, arg: None) -> None:
        value, key = self.pop(), self.pop()
        self._pairs(self._dict_at_top(), [key, value])

    def _setitems(self, arg: None) -> None:
        items = self.pop_mark()
        self._pairs(self._dict_at_top(), items)

    def _dict_at_top(self) -> dict:
        target = self.top()
        if type(target) is not dict:
            raise Refused("SETITEM on a non-dict")
        return target

    @staticmethod
    def _pairs(target: dict, items: list[Any]) -> dict:
        if len(items) % 2:
            raise Refused("odd number of dict items")
        for i in range(0, len(items), 2):
            if not isinstance(items[i], (str, int, float, bool, type(None), bytes)):
                raise Refused("dict key is not a plain value")
            target[items[i]] = items[i + 1]
        return target

    def _empty_set(self, arg: None) -> None:
        self.push(set())

    def _additems(self, arg: None) -> None:
        items = self.pop_mark()
        target = self.top()
        if type(target) is not set:
            raise Refused("ADDITEMS to a non-set")
        target.update(self._hashable(items))

    def _frozenset(self, arg: None) -> None:
        self.push(frozenset(self._hashable(self.pop_mark())))

    @staticmethod
    def _hashable(items: list[Any]) -> list[Any]:
        if not all(isinstance(item, (str, int, float, bool, type(None), bytes)) for item in items):
            raise Refused("set member is not a plain value")
        return items

    # ---- memo ---------------------------------------------------------------------------------------

    def _memoize(self, arg: None) -> None:
        self.memo[len(self.memo)] = self.top()

    def _binput(self, arg: int) -> None:
        self.memo[arg] = self.top()

    _long_binput = _put = _binput

    def _binget(self, arg: int) -> None:
        if arg not in self.memo:
            raise Refused(f"memo key {arg} unset")
        self.push(self.memo[arg])

    _long_binget = _get = _binget

    # ---- objects: names and records, never the real thing -------------------------------------------

    def _global(self, arg: str) -> None:
        module, _, name = arg.partition(" ")
        self.push(self._resolve(module, name))

    def _stack_global(self, arg: None) -> None:
        name, module = self.pop(), self.pop()
        self.push(self._resolve(module, name))

    def _newobj(self, arg: None) -> None:
        args, cls = self.pop(), self.pop()
        self.push(self._record(cls, args))

    def _newobj_ex(self, arg: None) -> None:
        kwargs, args, cls = self.pop(), self.pop(), self.pop()
        if kwargs != {}:
            raise Refused("NEWOBJ_EX with keyword arguments")
        self.push(self._record(cls, args))

    def _reduce(self, arg: None) -> None:
        args, func = self.pop(), self.pop()
        if isinstance(func, Global) and (func.module, func.name) in (("builtins", "set"), ("builtins", "frozenset")):
            # protocols 2 and 3 pickle a set as set([items]): read it as a plain frozenset
            if args == ():
                self.push(frozenset())
                return
            if not (type(args) is tuple and len(args) == 1 and type(args[0]) in (list, tuple)):
                raise Refused("set() with odd arguments")
            self.push(frozenset(self._hashable(list(args[0]))))
            return
        self.push(self._record(func, args))

    @staticmethod
    def _record(cls: Any, args: Any) -> Record:
        if not isinstance(cls, Global) or type(args) is not tuple:
            raise Refused("object construction from something other than an allowed class")
        return Record(cls, args)

    def _build(self, arg: None) -> None:
        state = self.pop()
        target = self.top()
        if type(target) is not Record or target.built:
            raise Refused("BUILD is accepted only once, on an object this frame made")
        target.state, target.built = state, True


_OPCODES = (
    "PROTO", "FRAME", "MARK", "NONE", "NEWTRUE", "NEWFALSE", "INT", "BININT", "BININT1", "BININT2", "LONG",
    "LONG1", "LONG4", "BINFLOAT", "FLOAT", "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8", "UNICODE",
    "SHORT_BINBYTES", "BINBYTES", "BINBYTES8", "EMPTY_TUPLE", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3",
    "EMPTY_LIST", "LIST", "APPEND", "APPENDS", "EMPTY_DICT", "DICT", "SETITEM", "SETITEMS", "EMPTY_SET",
    "ADDITEMS", "FROZENSET", "MEMOIZE", "BINPUT", "LONG_BINPUT", "PUT", "BINGET", "LONG_BINGET", "GET",
    "GLOBAL", "STACK_GLOBAL", "NEWOBJ", "NEWOBJ_EX", "REDUCE", "BUILD",
)
_DISPATCH: dict[str, Callable[[_Machine, Any], None]] = {name: getattr(_Machine, "_" + name.lower()) for name in _OPCODES}


def _children(value: Any) -> Collection[Any]:
    if isinstance(value, _LEAVES):
        return ()
    if isinstance(value, dict):
        return [*value.keys(), *value.values()]
    if isinstance(value, Record):
        return [*value.args, value.state]
    return value  # list, tuple, set, frozenset


def check_shape(root: Any) -> None:
    """Refuse values nested deeper than ``MAX_DEPTH`` or made of more than ``MAX_VALUES`` values."""
    todo = [(root, 1)]
    seen = 0
    while todo:
        value, depth = todo.pop()
        seen += 1
        if depth > MAX_DEPTH:
            raise Refused(f"nested deeper than {MAX_DEPTH}")
        if seen > MAX_VALUES:
            raise Refused(f"more than {MAX_VALUES} values")
        todo.extend((child, depth + 1) for child in _children(value))


def load(payload: bytes, allowed: Collection[tuple[str, str]]) -> Any:
    """The frame's value as plain containers, scalars, ``Global`` names and ``Record`` objects."""
    machine = _Machine(allowed)
    try:
        value = machine.run(payload)
    except Refused:
        raise
    except Exception as exc:  # truncated data, a bad opcode, a bad argument: genops raises ValueError & co
        raise Refused(f"malformed pickle: {type(exc).__name__}: {exc}") from None
    check_shape(value)
    return value
