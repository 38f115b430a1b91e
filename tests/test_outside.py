"""The readers of values from outside the process (``mbr_launch.outside``): pure, no process, no I/O."""

from __future__ import annotations

import json

import pytest

from mbr_launch import outside

pytestmark = pytest.mark.timeout(10)

NAN, INF = float("nan"), float("inf")


# ---- integer ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [0, -3, 7, 2**70])
def test_an_int_reads_as_itself(value):
    assert outside.integer(value) == value and type(outside.integer(value)) is int


@pytest.mark.parametrize("value", [True, False, 1.0, NAN, "1", b"1", None, [1], {"a": 1}])
def test_a_bool_a_float_or_a_string_is_no_int(value):
    assert outside.integer(value) is None


def test_an_int_out_of_its_bounds_is_refused_and_the_bounds_are_inclusive():
    assert outside.integer(5, 0, 5) == 5 and outside.integer(0, 0, 5) == 0
    assert outside.integer(6, 0, 5) is None and outside.integer(-1, 0, 5) is None
    assert outside.integer(-1, None, 5) == -1 and outside.integer(10**9, 0) == 10**9
    assert outside.integer(True, 0, 5) is None  # True == 1 is within [0, 5], but it is no int


# ---- finite -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value, read", [(0, 0.0), (3, 3.0), (2.5, 2.5), (-1e300, -1e300)])
def test_a_finite_number_reads_as_a_float(value, read):
    got = outside.finite(value)
    assert got == read and type(got) is float


@pytest.mark.parametrize("value", [NAN, INF, -INF, True, False, "1.0", None, 10**400, [1.0]])
def test_nan_infinities_bools_strings_and_ints_too_big_for_a_float_are_refused(value):
    assert outside.finite(value) is None


def test_a_number_out_of_its_bounds_is_refused():
    assert outside.finite(0.0, 0.0, 1.0) == 0.0 and outside.finite(1, 0.0, 1.0) == 1.0
    assert outside.finite(1.5, 0.0, 1.0) is None and outside.finite(-0.1, 0.0) is None
    assert outside.finite(NAN, -INF, INF) is None  # NaN compares false with every bound: refused first


# ---- text ---------------------------------------------------------------------------------------------------

def test_text_is_one_visible_bounded_line():
    got = outside.text("a\nb\x1b[2J\u202ec" + "x" * 5000, limit=40)
    assert "\n" not in got and "\x1b" not in got and "\u202e" not in got
    assert got.startswith("a\\nb\\x1b[2J\\u202ec") and got.endswith("more characters)")
    assert len(got) < 80
    assert outside.text("plain") == "plain"


@pytest.mark.parametrize("value", [None, 3, b"bytes", ["a"], {"a": "b"}])
def test_anything_but_a_string_reads_as_the_default(value):
    assert outside.text(value) == ""
    assert outside.text(value, "peer requested stop") == "peer requested stop"
    assert outside.text(value, None) is None


# ---- json_value ---------------------------------------------------------------------------------------------

def test_json_within_its_bounds_is_read():
    value = {"a": [1, 2.5, "x", None, True], "b": {"c": []}}
    assert outside.json_value(json.dumps(value)) == value
    assert outside.json_value(json.dumps(value).encode()) == value
    assert outside.json_value(b"[[1]]", depth=2) == [[1]] and outside.json_value(b"3", depth=0) == 3


@pytest.mark.parametrize("raw, why", [
    ('{"backoff": NaN}', "non-finite number \\(NaN\\)"),
    ("[Infinity]", "non-finite number \\(Infinity\\)"),
    ("[-Infinity]", "non-finite number \\(-Infinity\\)"),
    ('{"a": 1e999}', "non-finite number \\(1e999\\)"),  # valid JSON that float() reads as an infinity
    ("[-1E+400]", "non-finite number"),
    ("[" * 100_000 + "]" * 100_000, "not readable JSON \\(RecursionError\\)"),
    (b"\xff\xfe{}", "not readable JSON \\(UnicodeDecodeError\\)"),
    ("{", "not readable JSON \\(JSONDecodeError\\)"),
    ("", "not readable JSON"),
    ("[" * 9 + "]" * 9, "nested deeper than 8"),
    ("x" * 101, "101 bytes, over the bound of 100"),
])
def test_json_out_of_bounds_or_unreadable_is_refused_with_the_reason(raw, why):
    with pytest.raises(outside.RefusedValue, match=why):
        outside.json_value(raw, max_bytes=100 if raw[:1] in ("x", b"x") else outside.MAX_JSON_BYTES)


def test_the_size_bound_is_checked_before_parsing():
    raw = json.dumps(["y" * 50])  # 57 characters of valid JSON
    assert outside.json_value(raw, max_bytes=len(raw)) == ["y" * 50]
    with pytest.raises(outside.RefusedValue, match="over the bound"):
        outside.json_value(raw, max_bytes=len(raw) - 1)


def test_the_refusal_is_a_value_error_and_nothing_else_escapes():
    assert issubclass(outside.RefusedValue, ValueError)
    for raw in (b"\x00", b"[1,]", "\ud800", "[" + "9" * 5000 + "]", b"\x80" * 10):
        with pytest.raises(outside.RefusedValue):
            outside.json_value(raw)


def test_nesting_counts_levels_without_recursion():
    assert outside.nesting(3) == 0 and outside.nesting([]) == 1 and outside.nesting({"a": [[1]]}) == 3
    deep: list = []
    for _ in range(50_000):  # deeper than Python's recursion limit
        deep = [deep]
    assert outside.nesting(deep) == 50_001


def test_it_imports_only_the_standard_library_and_visible():
    """Every layer may use it, the worker's shim included: nothing it loads may pull in the agent."""
    import ast
    import sys
    from pathlib import Path

    from mbr_launch import visible

    def imports(path: str) -> set[str]:
        tree = ast.parse(Path(path).read_text())
        return ({a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
                | {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module})

    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    assert {m for m in imports(outside.__file__) if m.split(".")[0] not in stdlib} == {"mbr_launch.visible"}
    assert {m.split(".")[0] for m in imports(visible.__file__)} <= stdlib
