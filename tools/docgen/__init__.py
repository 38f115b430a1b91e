"""Generate the man page, the shell completions, the options page and the generated tables of the Markdown
pages (README.md's exit codes, docs/events.md's event names) from ``settings.SETTINGS``.

- ``man``: the man page; ``completions``: bash, zsh and fish; ``readme``: the options page and the
  Markdown pages' generated regions; ``common``: what they all need to know about a setting.
- here: which file each renderer writes, ``--write`` / ``--check``.

Every renderer is pure and deterministic (no dates, versions or paths), so the committed files can be
compared byte for byte with a fresh render: ``tests/test_docs.py`` fails when they drift, and
``scripts/gen-docs`` (``python -m tools.docgen --write``) regenerates them. ``--check`` lists stale
files and exits 1.

The settings are read from this package's global ``SETTINGS`` at call time and handed to the renderers, so
a test can swap in a modified tuple (``monkeypatch.setattr(docgen, "SETTINGS", ...)``) and watch the
check fail.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, Sequence

from mbr_launch.config.settings import SETTINGS

from . import completions, man, readme
from .readme import replace_region

ROOT = Path(__file__).resolve().parents[2]


def render_man() -> str:
    return man.render(SETTINGS)


def render_bash() -> str:
    return completions.render_bash(SETTINGS)


def render_zsh() -> str:
    return completions.render_zsh(SETTINGS)


def render_fish() -> str:
    return completions.render_fish(SETTINGS)


def render_options_page() -> str:
    """docs/options.md: every option in one place for readers on the web (the README links to it; a
    terminal has ``--help-all`` and the man page)."""
    return readme.options_page(SETTINGS)


def render_exit_codes() -> str:
    return readme.exit_codes()


def render_events() -> str:
    return readme.events_table()


# Markdown page -> its generated regions (the text between ``<!-- NAME:start -->`` and ``<!-- NAME:end -->``),
# each written by its renderer; the rest of the page is hand-written and left as it is.
REGIONS: dict[str, dict[str, Callable[[], str]]] = {
    "README.md": {"exitcodes": render_exit_codes},
    "docs/events.md": {"events": render_events},
}
RENDERERS: dict[str, Callable[[], str]] = {
    "man/mbr-launch.1": render_man,
    "completions/mbr-launch.bash": render_bash,
    "completions/_mbr-launch": render_zsh,
    "completions/mbr-launch.fish": render_fish,
    "docs/options.md": render_options_page,
}


def expected_files(root: Path) -> dict[str, str]:
    """Relative path -> the content it should have (a page with regions: its current text with fresh tables)."""
    files = {path: render() for path, render in RENDERERS.items()}
    for path, regions in REGIONS.items():
        text = (root / path).read_text()
        for name, render in regions.items():
            text = replace_region(text, render(), name, path)
        files[path] = text
    return files


def stale_files(root: Path) -> list[str]:
    return [path for path, text in expected_files(root).items()
            if not (root / path).is_file() or (root / path).read_text() != text]


def main(argv: Sequence[str] | None = None, root: Path = ROOT) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args not in (["--write"], ["--check"]):
        print("usage: python -m tools.docgen --write | --check", file=sys.stderr)
        return 2
    if args == ["--check"]:
        stale = stale_files(root)
        for path in stale:
            print(f"stale: {path} (run scripts/gen-docs)", file=sys.stderr)
        return 1 if stale else 0
    for path, text in expected_files(root).items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.is_file() or target.read_text() != text:
            target.write_text(text)
            print(f"wrote {path}")
    return 0
