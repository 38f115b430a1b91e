"""What a bench leaves behind: Markdown tables, its RESULTS.md section, the raw trial records (and reading
them back for --from-raw), and the trial directories."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Iterable, Sequence

from .paths import REPO


def table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def command_line() -> str:
    return "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(sys.argv[0], REPO), *sys.argv[1:]])


def write_section(path: Path, name: str, body: str) -> None:
    """Replace the ``<!-- name:start -->`` ... ``<!-- name:end -->`` block of path, or append one."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    block = f"{start}\n{body.rstrip()}\n{end}"
    text = path.read_text() if path.exists() else "# Benchmark results\n\nWritten by the scripts in `benchmarks/`" \
        " (see benchmarks/README.md); each script replaces only its own section.\n"
    if start in text and end in text:
        before, rest = text.split(start, 1)
        after = rest.split(end, 1)[1]
        text = before + block + after
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def write_raw(path: Path | None, records: list[dict]) -> None:
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(records, indent=1, default=str))


def load_raw(paths: Sequence[Path]) -> list[dict]:
    """The trials of several --raw files (earlier runs) for one report; file k's trials are renumbered
    from 1000*k so that runs never share a trial number (paired ratios pair within a run only)."""
    records = []
    for k, path in enumerate(paths):
        for rec in json.loads(Path(path).read_text()):
            rec["trial"] += 1000 * k
            records.append(rec)
    return records


def work_dir(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=f"mbr-bench-{prefix}-"))


def finish_dir(root: Path, keep: bool) -> None:
    if keep:
        print(f"trial logs kept in {root}", file=sys.stderr)
    else:
        shutil.rmtree(root, ignore_errors=True)


def publish(args: argparse.Namespace, section: str, text: str, records: list) -> int:
    """Print a bench's report, keep its raw trials (--raw) and write its RESULTS.md section (--out)."""
    print("\n" + text)
    write_raw(args.raw, records)
    if args.out:
        write_section(args.out, section, text)
    return 0
