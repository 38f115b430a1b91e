"""The package's layers, declared once: which package stands where, lowest first, and every module of
``mbr_launch`` with its layer; read by tests/test_layers.py (no import points up) and by scripts/layer-map
(the layer map in docs/architecture.md)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "mbr_launch"

# Lower first. A module may import its own package and packages before it in this list. A name is a package
# of mbr_launch (``decide`` is mbr_launch/decide/) or a module at its top (``contract`` is contract.py).
LAYERS = ("contract", "visible", "fdwait", "procstat", "forking", "gcpause", "nofile", "unpickle", "shim", "decide", "report", "config", "cluster", "workers",
          "health", "monitor", "agent", "doctor", "api", "cli", "__main__")


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name, for its ``__init__.py``)."""
    mods = {}
    for path in sorted(root.rglob("*.py")):
        parts = ("mbr_launch", *path.relative_to(root).with_suffix("").parts)
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return mods


def layer(module: str) -> str:
    """The layer of a dotted module name: its package under mbr_launch, or its own name at the top (the package
    itself, ``mbr_launch``, stands with the contract: it only names the project)."""
    return module.split(".")[1] if module != "mbr_launch" else "contract"
