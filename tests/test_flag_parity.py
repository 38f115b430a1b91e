"""Every torchrun option exists here with the same names, arity, default and PET_* fallback, and every prefix
torchrun's argparse takes for it means the same option here: checked against torch's own parser object
(``torch.distributed.run.get_args_parser()``), built in the test.

The installed torch's parser is always checked. ``MBR_TORCHRUN_PARSERS`` adds others, as ``VERSION=PATH`` pairs
separated by ``;`` where PATH is another release's ``torch/distributed/run.py`` (unzipped from its wheel, e.g.
``2.14.1=/tmp/t214/torch/distributed/run.py``); it is loaded with the installed torch's modules.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import os
import re
from typing import Callable

import pytest
from torch.distributed.run import get_args_parser

from mbr_launch.cli import app, plainline
from mbr_launch.cli.abbrev import AmbiguousOption, expand
from mbr_launch.config.host import release, torch_version
from mbr_launch.config.settings import SETTINGS, resolve

pytestmark = pytest.mark.timeout(120)

BY_DEST = {s.torchrun_dest: s for s in SETTINGS if s.torchrun_dest}
# torchrun options that are actions, not settings: what they do happens at once (print and exit)
NOT_SETTINGS = {"help", "print_completion"}


def _parsers() -> list[tuple[tuple[int, ...], Callable[[], argparse.ArgumentParser]]]:
    found = [(torch_version(), get_args_parser)]
    for pair in filter(None, os.environ.get("MBR_TORCHRUN_PARSERS", "").split(";")):
        version, _, path = pair.partition("=")
        spec = importlib.util.spec_from_file_location(f"torchrun_{version.replace('.', '_')}", path)
        assert spec and spec.loader, pair
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        found.append((release(version), module.get_args_parser))
    return found


PARSERS = _parsers()
IDS = [".".join(map(str, version)) for version, _ in PARSERS]


def _actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings]


@pytest.mark.parametrize("version,make", PARSERS, ids=IDS)
def test_every_torchrun_option_is_declared_with_its_own_spellings(version, make):
    for action in _actions(make()):
        if action.dest in NOT_SETTINGS:
            continue
        setting = BY_DEST.get(action.dest)
        assert setting is not None, f"torchrun's {action.dest} has no mbr-launch setting"
        assert set(action.option_strings) == set(setting.torchrun_flags), (action.option_strings, setting.flags)
        assert setting.torchrun_since <= version, (action.dest, setting.torchrun_since)
        assert setting.takes_value == (action.nargs != 0), action.dest


def test_torchrun_settings_absent_from_this_torch_are_newer():
    """A setting declared as torchrun's but missing from the installed parser must say which release adds it."""
    dests = {a.dest for a in _actions(get_args_parser())}
    for setting in BY_DEST.values():
        if setting.torchrun_dest not in dests:
            assert setting.torchrun_since > torch_version(), setting.name


@pytest.mark.parametrize("action", [a for _, make in PARSERS for a in _actions(make()) if a.dest not in NOT_SETTINGS],
                         ids=lambda a: a.dest)
def test_same_default_and_env(action: argparse.Action):
    setting = BY_DEST[action.dest]
    # env fallback: torchrun's `env`/`check_env` actions read PET_<DEST>
    reads_env = type(action).__name__ in ("env", "check_env")
    assert (f"PET_{action.dest.upper()}" in setting.env) == reads_env
    ours = resolve({}, {}, {}).values[setting.name]
    assert ours == _as_ours(action, action.default), f"{action.dest}: ours {ours!r} vs torchrun {action.default!r}"


def _as_ours(action: argparse.Action, theirs: object) -> object:
    """torchrun's value as a setting holds it (tuples for lists, signals split, switches as bools)."""
    if isinstance(theirs, list):
        theirs = tuple(theirs)
    if action.dest == "signals_to_handle":
        theirs = tuple(str(theirs).split(","))
    if isinstance(action, argparse._StoreTrueAction) or type(action).__name__ == "check_env":
        theirs = bool(theirs)
    return theirs


@pytest.mark.parametrize("version,make", PARSERS, ids=IDS)
def test_every_pet_variable_reads_as_torchrun_reads_it(version, make, monkeypatch):
    """Each PET_ variable set to values torchrun takes (a switch's any whole number: bool(int(value)))."""
    problems = []
    for action in _actions(make()):
        kind = type(action).__name__
        if kind not in ("env", "check_env"):
            continue
        name = f"PET_{action.dest.upper()}"
        for value in (("0", "1", "2", "-1") if kind == "check_env" else (_value(action),)):
            monkeypatch.setenv(name, value)
            theirs = _as_ours(action, make().parse_args(["script.py"]).__dict__[action.dest])
            monkeypatch.delenv(name)
            ours = resolve({}, {name: value}, {}).values[BY_DEST[action.dest].name]
            if ours != theirs:
                problems.append(f"{name}={value}: torchrun {theirs!r}, mbr-launch {ours!r}")
    assert not problems, problems


def test_cli_accepts_every_spelling_of_every_parser():
    names = set(app.spellings(app.launch_cli))
    for _, make in PARSERS:
        for action in _actions(make()):
            for flag in action.option_strings:
                assert flag in names, f"CLI does not accept torchrun's {flag}"


# ---- prefixes: what torchrun's argparse makes of each, and what mbr-launch makes of it ----------------------

_AMBIGUOUS = re.compile(r"ambiguous option: \S+ could match (.+)$", re.M)


def _value(action: argparse.Action) -> str:
    """A value the action takes that differs from its default."""
    if action.dest == "signals_to_handle":
        return "SIGUSR1,SIGTERM"
    if action.choices:
        return next(str(c) for c in action.choices if c != action.default)
    return "7" if action.type in (int, float) else "v7"


def _torchrun_reads(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[str, str | None] | list[str]:
    """(dest, value) of the one option torchrun's parser reads from ``argv``, or the candidates it names when
    it calls the option ambiguous."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parsed = parser.parse_args(argv)
    except SystemExit as stop:
        found = _AMBIGUOUS.search(err.getvalue())
        if found:
            return found.group(1).split(", ")
        assert stop.code == 0, err.getvalue()  # --help: printed and exited
        return ("help", None)
    defaults = parser.parse_args(["script.py"])
    changed = [(k, v) for k, v in vars(parsed).items() if v != getattr(defaults, k) and k != "training_script_args"]
    assert len(changed) == 1, (argv, changed)
    dest, value = changed[0]
    return dest, None if isinstance(value, bool) else str(value)


def _lines(action: argparse.Action) -> list[tuple[str, list[str]]]:
    """(prefix, command line) for every prefix argparse could take of each long option string of ``action``."""
    value = _value(action)
    lines = []
    for flag in (f for f in action.option_strings if f.startswith("--")):
        for end in range(3, len(flag) + 1):
            prefix = flag[:end]
            if action.nargs == 0:
                lines.append((prefix, [prefix, "script.py", "--x"]))
            elif action.dest != "print_completion":  # that one prints and exits: tested on its own
                lines.append((prefix, [prefix, value, "script.py", "--x"]))
                lines.append((prefix, [f"{prefix}={value}", "script.py", "--x"]))
    return lines


def _owner(dest: str) -> str:
    return BY_DEST[dest].name if dest in BY_DEST else dest


@pytest.mark.parametrize("version,make", PARSERS, ids=IDS)
def test_every_prefix_means_what_it_means_to_torchrun(version, make):
    """For each prefix of each option string: where torchrun reads one option, mbr-launch reads the same one, with
    the same value and the script's arguments untouched; where torchrun calls it ambiguous, mbr-launch does too,
    unless every candidate is a spelling of one option (then it is that option: the one documented difference)."""
    parser = make()
    table = app.spellings(app.launch_cli)
    dest_of = {flag: a.dest for a in _actions(parser) for flag in a.option_strings}
    problems, checked = [], 0
    for action in _actions(parser):
        for prefix, argv in _lines(action):
            checked += 1
            theirs = _torchrun_reads(parser, argv)
            try:
                ours = expand(argv, table, lambda: version)
            except AmbiguousOption as err:
                ours = err
            if isinstance(theirs, list):
                owners = {_owner(dest_of[c]) for c in theirs}
                if len(owners) > 1 and not isinstance(ours, AmbiguousOption):
                    problems.append(f"{argv}: torchrun: ambiguous ({theirs}); mbr-launch: {ours}")
                elif len(owners) == 1 and (isinstance(ours, AmbiguousOption) or table[ours[0].partition("=")[0]].owner
                                           not in owners):
                    problems.append(f"{argv}: torchrun: one option's spellings {theirs}; mbr-launch: {ours}")
                continue
            dest, value = theirs
            if isinstance(ours, AmbiguousOption):
                problems.append(f"{argv}: torchrun reads {dest}; mbr-launch: {ours}")
                continue
            full, _, inline = ours[0].partition("=")
            got = inline or (ours[1] if value is not None else None)
            given = None if value is None else _value(action)  # as typed: torchrun's is converted (7 -> 7.0)
            if table[full].owner != _owner(dest) or got != given or ours[-2:] != ["script.py", "--x"]:
                problems.append(f"{argv}: torchrun reads {dest}={value}; mbr-launch reads {ours}")
    assert checked > 500
    assert not problems, f"{len(problems)} of {checked} lines differ:\n" + "\n".join(problems[:20])


@pytest.mark.parametrize("argv,setting,value", [
    (["--redirect=3", "t.py"], "redirects", "3"),
    (["--nproc", "2", "t.py"], "nproc_per_node", "2"),  # torchrun (argparse): ambiguous, both spellings of one
    (["--max_restart=1", "t.py"], "max_restarts", "1"),
    (["--standal", "t.py"], "standalone", True),
    (["--h", "t.py"], None, None),  # torchrun's --help, though --hang-kill-grace and others start so too
    (["--local_ranks", "0", "t.py"], "local_ranks_filter", "0"),
])
def test_torchrun_prefixes_reach_the_launch_with_their_value(argv, setting, value, monkeypatch):
    """Through the launch's own readers: the plain line's and typer's give the same values."""
    expanded = expand(argv, plainline.SPELLINGS, lambda: (2, 13))
    if setting is None:
        assert expanded[0] == "--help"
        return
    values = plainline.read(expanded)
    assert values is not None and values[setting] == value and values["training_script"] == "t.py"
    seen: list[dict] = []
    monkeypatch.setattr(plainline, "launch", lambda got: seen.append(dict(got)) or 0)
    assert app._run_app(app.launch_cli, list(argv), "mbr-launch") == 0 and seen[0][setting] == value
