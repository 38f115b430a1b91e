"""docs/architecture.md's layer map is the one scripts/layer-map writes: the import rules (what each folder may
import), then every module of the package, under its folder, with the first sentence of its docstring. Static: no
module is imported."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tools import layermap
from tools.layers import ALLOWED, LAYERS, LEAVES, PROCESSES, modules

from .conftest import REPO


MODULES = modules()
PAGE = REPO / "docs" / "architecture.md"


def _section(page: str) -> str:
    start, end = page.index(layermap.BEGIN), page.index(layermap.END)
    return page[start:end + len(layermap.END)]


def test_every_module_says_what_it_holds():
    missing = sorted(name for name, path in MODULES.items() if not layermap.first_sentence(layermap.docstring(path)))
    assert not missing, f"give these modules a docstring whose first sentence says what they hold: {missing}"


def test_the_page_map_is_what_the_script_writes():
    assert layermap.PAGE == PAGE
    assert _section(PAGE.read_text()) == layermap.render(), \
        "docs/architecture.md's layer map is stale: run .venv/bin/python scripts/layer-map"


def test_every_module_is_named_in_the_map_once_by_a_link_that_resolves():
    section = _section(PAGE.read_text())
    for name, path in MODULES.items():
        link = Path(os.path.relpath(path, PAGE.parent)).as_posix()
        assert section.count(f"]({link})") == 1, f"{name} is not in the layer map (run scripts/layer-map)"
        assert (PAGE.parent / link).resolve() == path.resolve(), link
    # markers, note, blank lines, the rules' table: then one line per module
    assert len(section.splitlines()) == len(MODULES) + len(layermap.rules()) + 6


def test_the_map_follows_the_layers_lowest_first():
    tops = [line for line in layermap.render().splitlines() if line.startswith("- ")]
    order = [layer for layer in LAYERS if any(layermap.layer(m) == layer for m in MODULES)]
    named = [line.split("`")[1].removesuffix("/").removesuffix(".py") for line in tops]
    assert named == ["mbr_launch", *order]


def test_the_rules_table_gives_every_folder_its_list():
    rows = dict(row.removeprefix("| ").removesuffix(" |").split(" | ") for row in layermap.rules()[2:])
    bare = [leaf for leaf in LEAVES if not ALLOWED[leaf]]
    assert rows.pop("leaves: " + ", ".join(f"`{leaf}`" for leaf in bare)) == "the standard library only"
    assert rows.pop("`decide/`") == "`contract`, `visible`, `outside`"
    assert rows.pop("`outside`") == "`visible`"
    assert rows.pop("`monitor/`") == "leaves, `unpickle/`, `shim.proctitle`"
    assert rows.pop("`api`").startswith("leaves, `report/`, `config/`")
    assert len(rows) == len(ALLOWED) - len(bare) - 4 + len(PROCESSES)
    assert "only `monitor/`, `contract`, `procstat`, `unpickle/`" in layermap.rules()[-1]


@pytest.mark.parametrize(("doc", "sentence"), [
    ("One thing. Another.", "One thing."),
    ("Wrapped\n    over lines, e.g. this. Next.", "Wrapped over lines, e.g. this."),
    ("Opens a list:\n\n- one\n- two", "Opens a list"),
    ("Reads /proc/<pid>/stat, ``<pid>`` in code; *stars* and _private.", "Reads /proc/\\<pid>/stat, `<pid>` in code; "
                                                                         "\\*stars\\* and \\_private."),
    ("", ""),
])
def test_first_sentence(doc: str, sentence: str):
    assert layermap.first_sentence(doc) == sentence


def test_check_fails_on_a_stale_map_and_writing_mends_it(tmp_path, monkeypatch, capsys):
    page = tmp_path / "docs" / "architecture.md"
    page.parent.mkdir()
    page.write_text(f"# title\n\n{layermap.BEGIN}\n- an old line\n{layermap.END}\n\nafter\n")
    monkeypatch.setattr(layermap, "PAGE", page)
    assert layermap.main(["--check"]) == 1
    assert "stale" in capsys.readouterr().err and "an old line" in page.read_text()
    assert layermap.main([]) == 0
    text = page.read_text()
    assert text.startswith("# title\n\n") and text.endswith("\n\nafter\n") and "an old line" not in text
    assert layermap.main(["--check"]) == 0
    page.write_text("no markers\n")
    assert layermap.main(["--check"]) == 2


@pytest.mark.processes
def test_the_script_checks_the_committed_page():
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "layer-map"), "--check"], capture_output=True,
                          text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr
