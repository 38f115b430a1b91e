"""Values that came from outside this process (the store, a socket, a dump, a run folder), read as the type
we expect or refused: an int that is not a bool, a finite float, bounded text, bounded JSON.

A bool is an int to Python (``True`` would read as rank 1); NaN compares false with everything; ``json.loads``
takes ``NaN``, any size and any depth (RecursionError). The scalar readers answer None (or the default) for
what they do not read; ``json_value`` raises ``RefusedValue``. Standard library and ``visible`` only.
"""

from __future__ import annotations

import json
import math
from typing import Any, TypeVar

from mbr_launch.visible import one_line

MAX_TEXT = 2000  # characters of a string kept: a whole line of a launcher's message, with room
MAX_JSON_BYTES = 4 << 20  # what one read may cost by default; callers with a tighter bound pass it
MAX_JSON_DEPTH = 8

_D = TypeVar("_D")


class RefusedValue(ValueError):
    """A value from outside that cannot be read, or is not ours to trust; ``str()`` says why."""


def integer(value: object, low: int | None = None, high: int | None = None) -> int | None:
    """``value`` when it is an int (a bool is not one) within ``[low, high]`` (None: no bound), else None."""
    if not isinstance(value, int) or isinstance(value, bool):
        return None
    if (low is not None and value < low) or (high is not None and value > high):
        return None
    return value


def finite(value: object, low: float | None = None, high: float | None = None) -> float | None:
    """``value`` as a float when it is a finite int or float (not a bool) within ``[low, high]``, else None."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int too large for a float
        return None
    if not math.isfinite(number):
        return None
    if (low is not None and number < low) or (high is not None and number > high):
        return None
    return number


def text(value: object, default: _D = "", limit: int = MAX_TEXT) -> str | _D:  # type: ignore[assignment]
    """A string from outside as one safe line (``visible.one_line``) cut to ``limit``; ``default`` for a non-string."""
    return one_line(value, limit) if isinstance(value, str) else default


def _refuse_constant(name: str) -> Any:
    raise RefusedValue(f"a non-finite number ({name})")


def _finite_float(digits: str) -> float:
    number = float(digits)
    if not math.isfinite(number):  # 1e999 is valid JSON, and reads as an infinity
        raise RefusedValue(f"a non-finite number ({digits[:40]})")
    return number


def json_value(data: bytes | str, *, max_bytes: int = MAX_JSON_BYTES, depth: int = MAX_JSON_DEPTH) -> Any:
    """The JSON value in ``data`` within ``max_bytes`` and ``depth``, numbers finite; raises only RefusedValue."""
    if len(data) > max_bytes:
        raise RefusedValue(f"{len(data)} bytes, over the bound of {max_bytes}")
    try:
        value = json.loads(data if isinstance(data, str) else bytes(data).decode("utf-8"),
                           parse_constant=_refuse_constant, parse_float=_finite_float)
    except RefusedValue:
        raise
    except Exception as err:  # ValueError, UnicodeError, RecursionError: anything the parser raises
        raise RefusedValue(f"not readable JSON ({type(err).__name__})") from None
    if nesting(value) > depth:
        raise RefusedValue(f"nested deeper than {depth}")
    return value


def nesting(value: Any) -> int:
    """How deep ``value`` nests (a scalar: 0, a flat list or dict: 1), without recursion."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        item, level = todo.pop()
        if isinstance(item, (list, dict)):
            deepest = max(deepest, level)
            todo.extend((v, level + 1) for v in (item.values() if isinstance(item, dict) else item))
    return deepest

