"""Every torchrun flag of the installed torch exists here with the same names, default and PET_* fallback."""

from __future__ import annotations

import argparse

import pytest
from torch.distributed.run import get_args_parser

from mbr_launch.config.settings import SETTINGS, resolve

BY_DEST = {s.torchrun_dest: s for s in SETTINGS if s.torchrun_dest}


def _torch_actions() -> list[argparse.Action]:
    return [a for a in get_args_parser()._actions
            if a.option_strings and not isinstance(a, argparse._HelpAction)]


def test_every_torchrun_flag_is_declared():
    missing = [a.dest for a in _torch_actions() if a.dest not in BY_DEST]
    assert not missing, f"torchrun flags without a mbr-launch setting: {missing}"


@pytest.mark.parametrize("action", _torch_actions(), ids=lambda a: a.dest)
def test_same_names_default_and_env(action: argparse.Action):
    setting = BY_DEST[action.dest]
    assert set(action.option_strings) <= set(setting.flags), (action.option_strings, setting.flags)
    # env fallback: torchrun's `env`/`check_env` actions read PET_<DEST>
    reads_env = type(action).__name__ in ("env", "check_env")
    assert (f"PET_{action.dest.upper()}" in setting.env) == reads_env
    ours = resolve({}, {}, {}).values[setting.name]
    theirs = action.default
    if isinstance(theirs, list):
        theirs = tuple(theirs)
    if action.dest == "signals_to_handle":
        theirs = tuple(theirs.split(","))
    if action.dest == "duplicate_stdout_filters" or action.dest == "duplicate_stderr_filters":
        theirs = tuple(theirs)
    if isinstance(action, argparse._StoreTrueAction) or type(action).__name__ == "check_env":
        theirs = bool(theirs)
    assert ours == theirs, f"{action.dest}: ours {ours!r} vs torchrun {theirs!r}"


def test_cli_accepts_every_flag_spelling():
    import typer

    from mbr_launch.cli.app import app

    command = typer.main.get_command(app)
    names = {opt for param in command.params for opt in getattr(param, "opts", [])}
    for action in _torch_actions():
        for flag in action.option_strings:
            assert flag in names, f"CLI does not accept torchrun's {flag}"
