"""The package's shape, checked: higher layers import lower ones, never the reverse; no import cycle; no
module over 400 lines; the supervisor loop fits on one screen. Static (AST) checks: no process, no import."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tools.layers import LAYERS, ROOT, layer as _layer, modules

MAX_LINES = 400
LOOP_LINES = 60

MODULES = modules()


def _imports(name: str, path: Path) -> set[str]:
    """Every mbr_launch module ``name`` imports, wherever the import statement stands (function-local and
    TYPE_CHECKING imports are arrows too)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            # ``from pkg import submodule`` imports the submodule; ``from module import name``, the module
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != name and target != "mbr_launch":
                found.add(target)
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def test_every_package_has_a_layer():
    assert {_layer(m) for m in MODULES} <= set(LAYERS), \
        "add the new package to LAYERS in tools/layers.py (then run scripts/layer-map for docs/architecture.md)"


def test_no_arrow_points_up():
    rank = {layer: i for i, layer in enumerate(LAYERS)}
    upward = sorted(f"{src} -> {dst}" for src, targets in GRAPH.items() for dst in targets
                    if rank[_layer(dst)] > rank[_layer(src)])
    assert not upward, "imports from a higher layer:\n" + "\n".join(upward)


def test_no_import_cycle():
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(GRAPH[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = 2
        path.pop()
        return None

    for module in sorted(GRAPH):
        if module not in state and (cycle := visit(module)):
            pytest.fail("import cycle: " + " -> ".join(cycle))


def test_shim_imports_only_the_contract_and_stdlib_leaves():
    for src, targets in GRAPH.items():
        if _layer(src) == "shim":
            assert {_layer(t) for t in targets} <= {"shim", "contract", "fdwait", "procstat", "forking"}, (src, targets)


def test_no_module_over_400_lines():
    long = {name: n for name, path in MODULES.items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split these modules: {long}"


def test_the_supervisor_loop_fits_on_a_screen():
    tree = ast.parse((ROOT / "agent" / "loop.py").read_text())
    supervisor = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Supervisor")
    methods = {n.name: n for n in supervisor.body if isinstance(n, ast.FunctionDef)}
    loop = sum(methods[m].end_lineno - methods[m].lineno + 1 for m in ("run", "_watch"))  # type: ignore[operator]
    assert loop <= LOOP_LINES, f"the loop (run + _watch) is {loop} lines"


def test_the_checks_see_the_package():
    # Guards the guards: a broken scan would pass every test above.
    assert len(MODULES) > 60
    assert "mbr_launch.agent.loop" in GRAPH and "mbr_launch.agent.handlers" in GRAPH["mbr_launch.agent.loop"]
