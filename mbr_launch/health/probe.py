"""Touch storage paths in a process of its own: a hung NFS or Lustre mount blocks this process, not the
launcher, which kills it after its timeout (``readers.probe_paths``).

    python -I -S probe.py read|list PATH...

``read`` (storage paths): the path is absolute and exists; a file gives its first 4 KiB, a folder its
listing, anything else a stat. ``list`` (network mounts): the path is a folder and lists. One JSON line
per path on stdout, written as soon as that path is done, so a caller that gives up knows which path hung.
Standard library only, run with -S: it starts in milliseconds and imports nothing of the launcher.
"""

from __future__ import annotations

import json
import os
import stat
import sys


def probe(path: str, mode: str) -> tuple[str, str]:
    """(status, detail) for one path: ok, invalid, missing, unreadable or not a directory."""
    if not path.startswith("/"):
        return "invalid", ""
    path = os.path.normpath(path)
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return "missing", ""
    except OSError as err:
        return "unreadable", err.strerror or str(err)
    try:
        if stat.S_ISDIR(info.st_mode):
            with os.scandir(path) as entries:
                for _ in zip(range(5), entries):
                    pass
        elif mode == "list":
            return "not a directory", ""
        elif stat.S_ISREG(info.st_mode):
            with open(path, "rb") as f:
                f.read(4096)
    except OSError as err:
        return "unreadable", err.strerror or str(err)
    return "ok", ""


def main(argv: list[str]) -> int:
    mode, paths = argv[0], argv[1:]
    for path in paths:
        status, detail = probe(path, mode)
        sys.stdout.write(json.dumps({"path": path, "status": status, "detail": detail}) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
