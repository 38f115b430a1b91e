"""The launch from a plain command line, without typer.

typer (with click, rich and pydantic) costs every agent CPU before its rank can start. Most launch lines are
plain: settings' flags, each once, then SCRIPT and its arguments. ``read`` reads exactly those into the values
typer would pass to ``launch_command`` (``test_plainline`` compares the two) and returns None for anything
else, which typer then parses as always and reports on."""

from __future__ import annotations

from typing import Any, Sequence

from mbr_launch.cli.abbrev import HELP, LAUNCH_EXTRAS, AmbiguousOption, expand, setting_spellings
from mbr_launch.cli.process import PROG, USER_ENV, CommandError, error, guarded, prepare
from mbr_launch.config.host import torch_version
from mbr_launch.config.settings import BY_FLAG, SETTINGS
from mbr_launch.report import exitcodes

# Subcommands: their first word is never a script (``cli.app`` registers them under these names).
DOCTOR, REPORT, STORE = "doctor", "report", "store"
SUBCOMMANDS = (DOCTOR, REPORT, STORE)
# Every option string of the launch, for abbreviated options (``cli.abbrev``); ``test_abbrev`` compares it with
# typer's command.
SPELLINGS = {**setting_spellings(SETTINGS), **HELP, **LAUNCH_EXTRAS}


def read(argv: Sequence[str]) -> dict[str, Any] | None:
    """``launch_command``'s keyword arguments for a plain ``argv``; None when typer must read it."""
    if argv and argv[0] in SUBCOMMANDS:
        return None
    given: dict[str, Any] = {}
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        token = argv[i]
        name, equals, inline = token.partition("=") if token.startswith("--") else (token, "", "")
        setting = BY_FLAG.get(name)  # anything else (--help, --, -, combined short flags, a typo): typer's
        if setting is None or setting.name in given:
            return None
        if not setting.takes_value:
            if equals:
                return None
            given[setting.name], i = True, i + 1
            continue
        if equals:
            value, i = inline, i + 1
        elif i + 1 < len(argv):
            value, i = argv[i + 1], i + 2
        else:
            return None
        if not value or value.startswith("-"):
            return None
        given[setting.name] = value
    if i >= len(argv):
        return None
    values: dict[str, Any] = {setting.name: given.get(setting.name) for setting in SETTINGS}
    rest = argv[i + 1:]
    values.update(training_script=argv[i], training_script_args=list(rest) if rest else None, help_all=False,
                  version=False, print_completion=None)
    return values


def launch(values: dict[str, Any]) -> int:
    from mbr_launch.api import build_launch_config, launch as run_agent
    from mbr_launch.config.errors import ConfigError

    script = values.pop("training_script")
    script_args = tuple(values.pop("training_script_args") or ())
    try:
        cfg = build_launch_config(cli=values, script=script, script_args=script_args, environ=USER_ENV)
        # The run folder and the socket folder are checked when the agent makes them: a refusal there is
        # a usage error too (exit 2), not a crash.
        return run_agent(cfg, environ=USER_ENV, exit_after=True)
    except ConfigError as err:
        raise CommandError(str(err)) from None


def run(argv: Sequence[str]) -> int | None:
    """Launch from a plain ``argv`` (the exit code), or None: typer's turn (``cli.app.main``)."""
    if argv and argv[0] in SUBCOMMANDS:
        return None
    try:
        argv = expand(argv, SPELLINGS, torch_version)
    except AmbiguousOption as err:
        error(f"{err} (see {PROG} --help)")
        return exitcodes.USAGE
    values = read(argv)
    if values is None:
        return None
    prepare()
    return guarded(lambda: launch(values))
