"""The plain launch line read without typer (``cli.plainline``): for every flag of the settings table, the values
are exactly typer's; anything that is not plain is left to typer."""

from __future__ import annotations

from typing import Any

import pytest

from mbr_launch.cli import app, plainline
from mbr_launch.cli.helptext import COMMANDS
from mbr_launch.config.settings import SETTINGS

pytestmark = pytest.mark.timeout(60)


def _typer_values(argv: list[str], monkeypatch) -> dict[str, Any]:
    """What typer hands to the launch (``launch_command`` passes its values on to ``plainline.launch``)."""
    seen: list[dict[str, Any]] = []
    monkeypatch.setattr(plainline, "launch", lambda values: seen.append(dict(values)) or 0)
    app.launch_cli.main(args=argv, prog_name="mbr-launch", standalone_mode=False)
    assert len(seen) == 1, argv
    return seen[0]


def _plain_lines() -> list[list[str]]:
    lines = []
    for setting in SETTINGS:
        for flag in setting.flags:
            if setting.takes_value:
                lines.append([flag, "v1", "train.py"])
                if flag.startswith("--"):
                    lines.append([f"{flag}=v=2", "train.py", "a"])
            else:
                lines.append([flag, "train.py", "--lr", "1"])
    every = [part for s in SETTINGS for part in ([s.flags[0], "x"] if s.takes_value else [s.flags[0]])]
    lines.append([*every, "train.py", "--nnodes", "9", "--", "-q"])  # every setting at once
    lines.append(["train.py"])
    lines.append(["--nnodes", "1:2", "-q", "--standby=off", "pkg/train.py", "--help", "-"])
    return lines


@pytest.mark.parametrize("argv", _plain_lines(), ids=lambda argv: " ".join(argv)[:60])
def test_a_plain_line_reads_as_typer_reads_it(argv, monkeypatch):
    values = plainline.read(argv)
    assert values is not None, argv  # plain: no typer on the launch's path
    assert values == _typer_values(argv, monkeypatch)


@pytest.mark.parametrize("argv", [
    [], ["--help"], ["-h"], ["--help-all"], ["--version"], ["--nnodes", "2"],  # no script
    ["--", "train.py"], ["-", "x"], ["--nnodes", "2", "--nnodes", "3", "t.py"], ["--no-such", "t.py"],
    ["--quiet=1", "t.py"], ["--nnodes"], ["--nnodes", "-1", "t.py"], ["--nnodes=", "t.py"], ["-qm", "t.py"],
    ["-rx", "t.py"], ["--nnodes", "2", "-h", "t.py"],
], ids=lambda argv: " ".join(argv) or "(empty)")
def test_anything_else_is_typers(argv):
    assert plainline.read(argv) is None


def test_subcommands_are_never_scripts():
    assert set(plainline.SUBCOMMANDS) == set(COMMANDS)  # every subcommand cli.app registers
    for name in plainline.SUBCOMMANDS:
        assert plainline.read([name, "--json"]) is None and plainline.read([name]) is None


def test_a_mistake_still_gets_typers_message(capsys):
    assert app.main(["--nnodes", "2", "--nnodes"]) == 2  # what plainline.read left to it
    assert "requires an argument" in capsys.readouterr().err
