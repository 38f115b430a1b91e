"""Which mbr-launch this is, and on which torch, NVRx and Python (``--version``, the doctor, the ``start``
event). Read from the packages' metadata, never by importing them: ``--version`` must work with a broken torch;
pip's ``*.dist-info`` folder directly, as ``importlib.metadata`` would find it, only faster.
"""

from __future__ import annotations

import os
import platform
import re
import sys
from typing import Iterable

import mbr_launch

PROG = "mbr-launch"
DEPENDENCIES = ("torch", "nvidia-resiliency-ext")


def installed(dist: str) -> str | None:
    """The installed version of distribution ``dist``; None when it is not installed (or unreadable)."""
    try:
        found = metadata_folder(dist, sys.path)
        if found is not None and found[0] is not None:
            return found[0]
        import importlib.metadata  # noqa: PLC0415 - an egg, a zip, a custom finder: the full search

        return importlib.metadata.version(dist)
    except Exception:  # not installed, or a broken dist-info: must not break --version
        return None


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def metadata_folder(dist: str, paths: Iterable[str]) -> tuple[str | None, str] | None:
    """(version, folder) of the first ``*.dist-info``/``*.egg-info`` of ``dist`` in ``paths`` (a worker's), or None."""
    want = _normal(dist)
    for entry in paths:
        try:
            names = os.listdir(entry or ".")
        except OSError:  # a zip file, a folder gone: not ours to read here
            continue
        for name in names:
            stem, dot, kind = name.rpartition(".")
            if dot and kind in ("dist-info", "egg-info") and _normal(stem.partition("-")[0]) == want:
                folder = os.path.join(entry or ".", name)
                return _version_field(os.path.join(folder, "METADATA" if kind == "dist-info" else "PKG-INFO")), folder
    return None


def _version_field(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():  # the headers end at the first blank line
                    break
                if line.startswith("Version:"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def versions() -> dict[str, str | None]:
    """{"mbr-launch": X.Y.Z, "torch": A or None, "nvidia-resiliency-ext": B or None, "python": C}."""
    found: dict[str, str | None] = {PROG: mbr_launch.__version__}
    found.update({dist: installed(dist) for dist in DEPENDENCIES})
    found["python"] = platform.python_version()
    return found


def version_line(found: dict[str, str | None] | None = None) -> str:
    """``mbr-launch 0.1.0 (torch 2.13.0, nvidia-resiliency-ext 0.4.1, python 3.11.2)``."""
    found = versions() if found is None else found
    rest = ", ".join(f"{name} {value or 'not installed'}" for name, value in found.items() if name != PROG)
    return f"{PROG} {found[PROG]} ({rest})"
