"""Whether a training script can need torch at all, read from its source without running it.

Such a script gets the ``interpreter`` standby level instead of preloading torch (why: docs/performance.md).
The test is conservative: anything that can import a module this scan cannot see (a package outside the
standard library, a relative import, ``importlib``, ``__import__``, ``exec``, a source that does not parse)
counts as "may need torch", which keeps the level asked for."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

# Standard-library ways of importing a module by a name computed at run time.
_DYNAMIC_MODULES = frozenset({"importlib", "runpy", "imp", "pkgutil", "zipimport"})
_DYNAMIC_CALLS = frozenset({"__import__", "exec", "eval", "compile"})
_MAX_BYTES = 4 * 1024 * 1024  # a larger entry script is not read (it keeps the asked-for level)


def imports_only_stdlib(script: str | None) -> bool:
    """True when ``script`` (a file path, never a ``-m`` module) provably imports only the standard library."""
    if not script:
        return False
    path = Path(script)
    try:
        if not path.is_file() or path.stat().st_size > _MAX_BYTES:
            return False
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (OSError, SyntaxError, ValueError, RecursionError):
        return False
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots = [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: the script belongs to a package of its own
                return False
            roots = [(node.module or "").split(".")[0]]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _DYNAMIC_CALLS:
            return False
        else:
            continue
        if any(root not in stdlib or root in _DYNAMIC_MODULES for root in roots):
            return False
    return True
