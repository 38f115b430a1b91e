"""Which mbr-launch this is, and on which torch, NVRx and Python: for ``--version``, the doctor and the
``start`` event, so a bug report (exit code 4) says what ran.

Read from the installed packages' metadata, never by importing them: ``--version`` must stay instant and
must work when torch itself is broken.
"""

from __future__ import annotations

import importlib.metadata
import platform

import mbr_launch

PROG = "mbr-launch"
DEPENDENCIES = ("torch", "nvidia-resiliency-ext")


def installed(dist: str) -> str | None:
    """The installed version of distribution ``dist``; None when it is not installed (or unreadable)."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None
    except Exception:  # a broken dist-info must not break --version
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
