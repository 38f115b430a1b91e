"""The layer map of docs/architecture.md, written from the code: the import rules of ``tools/layers.py`` (what each
folder may import) as a table, then every module of ``mbr_launch``, grouped by folder, one line each with the first
sentence of its docstring.

``python -m tools.layermap [--check]`` (``scripts/layer-map``) rewrites the text between the two marker
comments in docs/architecture.md; ``--check`` writes nothing and exits 1 when that text is stale.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import sys
from pathlib import Path

from tools.layers import ALLOWED, LAYERS, LEAVES, PROCESSES, ROOT, layer, modules

PAGE = ROOT.parent / "docs" / "architecture.md"
BEGIN, END = "<!-- layer-map:begin -->", "<!-- layer-map:end -->"
NOTE = ("<!-- Written by scripts/layer-map from tools/layers.py (the rules) and each module's docstring (its first "
        "sentence); do not edit. -->")

# A sentence ends at a full stop followed by a new sentence (a capital, code or a quote): "e.g. a" goes on.
_END = re.compile(r"(?<=\.)\s+(?=[A-Z`\"(])")


def docstring(path: Path) -> str:
    return ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"), str(path))) or ""


def first_sentence(doc: str) -> str:
    """The first sentence of a docstring's first paragraph, on one line, in Markdown (``code`` -> `code`; one
    that opens a list, "...:", ends at its colon)."""
    paragraph = " ".join(doc.strip().split("\n\n", 1)[0].split())
    sentence = _END.split(paragraph, 1)[0].removesuffix(":") if paragraph else ""
    return _markdown(sentence)


def _markdown(text: str) -> str:
    """rST's ``code`` as Markdown's `code`; outside code, what Markdown would take for a tag (``<pid>``) or
    emphasis escaped."""
    pieces = text.replace("``", "`").split("`")
    for i in range(0, len(pieces), 2):  # the even pieces are outside code
        pieces[i] = re.sub(r"<(?=[A-Za-z/!?])|\*|(?<!\w)_", lambda m: "\\" + m.group(0), pieces[i])
    return "`".join(pieces)


def _label(module: str, path: Path) -> str:
    """The module's name in the map: a file (``causes.py``) or a package (``decide/``), under its parent."""
    if module == "mbr_launch":
        return "mbr_launch/"
    return f"{module.rsplit('.', 1)[1]}{'/' if path.name == '__init__.py' else '.py'}"


def _depth(module: str) -> int:
    """How far the module's line is indented: 0 for a layer (a package under mbr_launch, or a module at its top)
    and the package itself, one more per package below."""
    return max(0, module.count(".") - 1)


def _name(entry: str) -> str:
    """An allow-list entry as the table shows it: a folder with its slash, a module by its dotted name."""
    return f"`{entry}/`" if (ROOT / entry).is_dir() else f"`{entry}`"


def _entries(names: tuple[str, ...]) -> str:
    """An allow-list in words: the leaves as one word where it takes them all."""
    if not names:
        return "the standard library only"
    rest = [n for n in names if n not in LEAVES] if set(LEAVES) <= set(names) else list(names)
    return ", ".join(["leaves"] * (len(rest) < len(names)) + [_name(n) for n in rest])


def rules() -> list[str]:
    """The import rules as a table: each folder (the leaves that take the standard library only in one row),
    what it may import besides itself; then each process of its own, all that it may load."""
    bare = [n for n in LAYERS if n in LEAVES and not ALLOWED[n]]
    rows = [f"| leaves: {', '.join(_name(n) for n in bare)} | the standard library only |"]
    rows += [f"| {_name(n)} | {_entries(ALLOWED[n])} |" for n in LAYERS if n not in bare]
    rows += [f"| the process of `{entry}` (all it imports, followed through) | only {_entries(names)} |"
             for entry, names in PROCESSES.items()]
    return ["| folder | may import, besides its own modules |", "|---|---|", *rows]


def render(mods: dict[str, Path] | None = None) -> str:
    """The map, markers included: the rules' table, then the folders lowest first, in each the package's line,
    then its modules, each linked relative to the page's folder."""
    mods = modules() if mods is None else mods
    here = PAGE.parent
    out = [BEGIN, NOTE, "", *rules(), ""]
    for name in LAYERS:
        members = sorted((m for m in mods if layer(m) == name), key=lambda m: (m != "mbr_launch", m.split(".")))
        for module in members:
            path = mods[module]
            text = first_sentence(docstring(path)) or "(no docstring)"
            link = Path(os.path.relpath(path, here)).as_posix()
            out.append(f"{'  ' * _depth(module)}- [`{_label(module, path)}`]({link}): {text}")
    return "\n".join([*out, "", END])


def rewrite(page: str, section: str) -> str:
    """``page`` with the text from the begin marker to the end marker (both included) replaced by ``section``."""
    start, end = page.find(BEGIN), page.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{PAGE.name} lacks the markers {BEGIN} ... {END}")
    return page[:start] + section + page[end + len(END):]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/layer-map", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help=f"write nothing; exit 1 when {PAGE.name} is stale")
    args = parser.parse_args(argv)
    current = PAGE.read_text(encoding="utf-8")
    try:
        expected = rewrite(current, render())
    except ValueError as exc:
        print(f"layer-map: {exc}", file=sys.stderr)
        return 2
    if expected == current:
        return 0
    if args.check:
        print(f"layer-map: {PAGE.name}'s layer map is stale: run scripts/layer-map", file=sys.stderr)
        return 1
    PAGE.write_text(expected, encoding="utf-8")
    print(f"layer-map: {PAGE.name} rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
