"""Touch storage paths in a process of its own (``python -I -S probe.py read|list PATH...``): a hung mount
blocks this process, not the launcher, which kills it after its timeout (``suite.probe_paths``).

One JSON line per path, flushed as each is done, so a caller that gives up knows which path hung.
"""

from __future__ import annotations

import json
import os
import stat
import sys


def probe(path: str, mode: str) -> tuple[str, str]:
    """(status, detail) for one path: ok, invalid, missing, unreadable or not a directory. ``read``: a file
    gives its first 4 KiB, a folder its listing; ``list``: the path is a folder and lists."""
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
