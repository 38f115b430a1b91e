"""The command line: a thin typer layer over ``mbr_launch.api``.

One typer app per command (each command a module of its own), the subcommand table, and every outcome made one
exit code and at most one line of error."""

from __future__ import annotations

import sys
from typing import Callable

import typer
import typer.core

from mbr_launch.cli.abbrev import ALWAYS, HELP, LAUNCH_EXTRAS, AmbiguousOption, Spelling, expand
from mbr_launch.cli.doctor import ARGV, DOCTOR_NOT_RUN, doctor_command, print_json_error
from mbr_launch.cli.helptext import COMMANDS, HelpCommand
from mbr_launch.cli.launch import launch_command
from mbr_launch.cli.report import report_command
from mbr_launch.cli.store import store_command
from mbr_launch.cli.process import PROG, error, guarded, prepare
from mbr_launch.cli.plainline import DOCTOR, REPORT, STORE
from mbr_launch.config.host import torch_version
from mbr_launch.config.settings import BY_NAME
from mbr_launch.report import exitcodes
from mbr_launch.gcpause import resume_gc

# No interspersed args: everything after SCRIPT is the script's, even when it looks like our option.
CONTEXT = {"allow_interspersed_args": False, "help_option_names": ["-h", "--help"]}


def _typer(context: dict | None = None) -> typer.Typer:
    return typer.Typer(add_completion=False, context_settings=context or CONTEXT, rich_markup_mode="rich",
                       pretty_exceptions_enable=False)


def command(name: str, function: Callable[..., None], *, usage: str, subcommand: bool = True,
            context: dict | None = None) -> typer.core.TyperCommand:
    """One typer app per command, not one app with subcommands: ``mbr-launch SCRIPT`` must not read SCRIPT as a
    command name. Registering a subcommand here lists it in --help and the completions."""
    application = _typer(context)
    application.command(name=name, cls=HelpCommand)(function)
    cli = typer.main.get_command(application)
    if not isinstance(cli, HelpCommand):
        raise TypeError(f"register {name!r} with cls=HelpCommand")
    cli.usage_args, cli.is_subcommand = usage, subcommand
    if subcommand:
        COMMANDS[name] = cli
    return cli


launch_cli = command(PROG, launch_command, usage="[OPTIONS] SCRIPT [ARGS]...", subcommand=False)
doctor_cli = command(DOCTOR, doctor_command, usage="[OPTIONS] [SCRIPT [ARGS]...]")
# No script: the report's options may come anywhere.
report_cli = command(REPORT, report_command, usage="[RUN_DIR] [OPTIONS]",
                     context={**CONTEXT, "allow_interspersed_args": True})
store_cli = command(STORE, store_command, usage="[OPTIONS]")
# typer's view of the launch, for tests that inspect the parser (test_docs).
app = _typer()
app.command(name=PROG, cls=HelpCommand)(launch_command)


def spellings(cli: typer.core.TyperCommand) -> dict[str, Spelling]:
    """Every option string of a command, for ``cli.abbrev``, torchrun's marked with the release that has them."""
    table = dict(HELP)
    for param in cli.params:
        if param.param_type_name != "option":
            continue
        setting = BY_NAME.get(param.name or "")
        for flag in (*param.opts, *param.secondary_opts):
            extra = LAUNCH_EXTRAS.get(flag)
            since = ((setting.torchrun_since or ALWAYS) if flag in setting.torchrun_flags else None) if setting \
                else extra.torchrun_since if extra else None
            table[flag] = Spelling(owner=param.name or flag, takes_value=not getattr(param, "is_flag", False),
                                   torchrun_since=since)
    return table


def _run_app(cli: typer.core.TyperCommand, argv: list[str], prog: str, *, usage_code: int = exitcodes.USAGE,
             on_usage: Callable[[str], None] | None = None) -> int:
    """``usage_code`` and ``on_usage`` (given the message) handle the parser's own errors: the doctor has its own
    code for "could not run", and prints JSON with --json."""
    def usage(problem: str) -> int:
        message = f"{problem} (see {prog} --help)"
        if on_usage is not None:
            on_usage(message)
        error(message)
        return usage_code

    try:
        argv = expand(argv, spellings(cli), torch_version)
    except AmbiguousOption as err:
        return usage(str(err))
    try:
        # Without standalone mode the parser returns the command's exit code instead of raising.
        # obj: the command line as typed, for a command that must see its spellings (doctor: --ft-param-*).
        result = cli.main(args=argv, prog_name=prog, standalone_mode=False, obj={ARGV: tuple(argv)})
        if isinstance(result, int):
            return result
    except typer.Exit as done:
        return int(done.exit_code)
    except typer.Abort:
        return 128 + 2
    except Exception as err:
        # Usage errors from the parser carry an exit code and a message: show one line, no traceback.
        if hasattr(err, "format_message") and hasattr(err, "exit_code"):
            return usage(err.format_message())
        raise
    return exitcodes.OK


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    prepare()
    return guarded(lambda: _dispatch(argv))


def _dispatch(argv: list[str]) -> int:
    if argv and argv[0] in COMMANDS:
        resume_gc()  # only the launch keeps it paused until its imports are done (api.launch)
    if argv and argv[0] == DOCTOR:
        as_json = "--json" in argv[1:]  # the parser failed before it could say so
        return _run_app(doctor_cli, argv[1:], f"{PROG} {DOCTOR}", usage_code=DOCTOR_NOT_RUN,
                        on_usage=print_json_error if as_json else None)
    if argv and argv[0] in COMMANDS:
        return _run_app(COMMANDS[argv[0]], argv[1:], f"{PROG} {argv[0]}")
    return _run_app(launch_cli, argv, PROG)
