"""Every class in the package has a name of its own, so that a name in a traceback, a log line or a grep
points at one class. Static (AST): no import."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from tools.layers import ROOT, modules


def _classes(sources: dict[str, str]) -> dict[str, list[str]]:
    """Class name -> where each class of that name is defined (``module:line``), nested classes included."""
    found: dict[str, list[str]] = defaultdict(list)
    for module, text in sources.items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                found[node.name].append(f"{module}:{node.lineno}")
    return found


def _duplicates(sources: dict[str, str]) -> dict[str, list[str]]:
    return {name: where for name, where in sorted(_classes(sources).items()) if len(where) > 1}


def test_every_class_name_in_the_package_is_unique():
    sources = {str(Path(path).relative_to(ROOT.parent)): Path(path).read_text() for path in modules().values()}
    assert len(_classes(sources)) > 100  # the walk found the package's classes
    assert _duplicates(sources) == {}


def test_a_name_defined_twice_is_found_nested_ones_too():
    sources = {"a.py": "class Result:\n    pass\n",
               "b.py": "def f():\n    class Result:\n        pass\n\nclass Other:\n    class Inner:\n        pass\n",
               "c.py": "class Inner:\n    pass\n"}
    assert _duplicates(sources) == {"Inner": ["b.py:6", "c.py:1"], "Result": ["a.py:1", "b.py:2"]}
