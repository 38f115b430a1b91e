"""The command-line options, generated from the settings table (``config.settings.SETTINGS``), and ``--help``
and ``--help-all`` as plain text that fits the terminal.

Each option's flag and value hint on one line, its help wrapped beneath, so nothing is ever cut off. Plain
``--help`` shows the ``common`` settings; ``--help-all`` every setting by panel, with its environment variables."""

from __future__ import annotations

import inspect
import shutil
import textwrap
from typing import Annotated, Any, Callable, Optional

import typer
import typer.core
from rich.markup import escape

from mbr_launch.config.settings import BY_NAME, PANELS, SETTINGS, Setting, default_text, in_panel_order
from mbr_launch.report.version import PROG, version_line

INDENT, WIDEST = 6, 100  # help text beneath its flag; past 100 columns lines only get harder to read
HELP_ALL = "help_all"  # ctx.meta key: render every setting
# Subcommand name -> its click command, in the order they are listed; ``cli.app`` fills it.
COMMANDS: dict[str, typer.core.TyperCommand] = {}


def option_help(setting: Setting, *, env: bool = True) -> str:
    """The help text with the default and (``env``) the environment variables, as --help and the man page show it."""
    parts = [setting.help]
    if setting.takes_value and (default := default_text(setting)):
        parts.append(f"[default: {default}]")
    if env:
        parts.append(f"[env: {', '.join(setting.envvars)}]")
    return " ".join(parts)


def setting_parameter(setting: Setting) -> inspect.Parameter:
    """A keyword-only parameter that accepts every flag spelling of ``setting``. Its default is None, so that the
    resolver can tell "not given" and fall back to the environment, the config file and the declared default."""
    # escape: rich would read "[default: 1:1]" as a style tag and drop it
    option = typer.Option(*setting.flags, help=escape(option_help(setting)), rich_help_panel=setting.panel,
                          show_default=False, metavar=setting.metavar or None, hidden=setting.hidden)
    kind = Optional[str] if setting.takes_value else Optional[bool]
    return inspect.Parameter(setting.name, inspect.Parameter.KEYWORD_ONLY, default=None,
                             annotation=Annotated[kind, option])


def keyword(name: str, default: Any, annotation: Any) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)


def with_settings(command: Callable[..., None], *extra: inspect.Parameter) -> Callable[..., None]:
    """Give ``command(**values)`` one option per setting, in help-panel order, then ``extra``: typer reads a
    command's parameters from its signature, and the settings table is data."""
    command.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [*(setting_parameter(s) for s in in_panel_order(SETTINGS)), *extra])
    return command


def width() -> int:
    return max(50, min(WIDEST, shutil.get_terminal_size((80, 24)).columns))


def _wrap(text: str, cols: int, indent: int = INDENT) -> list[str]:
    return textwrap.wrap(text, cols - 1, initial_indent=" " * indent, subsequent_indent=" " * indent,
                         break_on_hyphens=False, break_long_words=True) or [""]


def _entry(head: str, body: str, cols: int) -> list[str]:
    return _wrap(head, cols, 2) + _wrap(body, cols)


def setting_head(setting: Setting, *, aliases: bool) -> str:
    short = [f for f in setting.shown_flags if not f.startswith("--")]
    long = [f for f in setting.shown_flags if f.startswith("--")]
    # A short flag reads first (-m, --module), as in most tools; other spellings only in --help-all.
    flags = short + (long if aliases else long[:1])
    hint = " ".join(p for p in (setting.value_hint, setting.bounds) if p)
    return ", ".join(flags) + (f" {hint}" if hint else "")


def _own_options(command: typer.core.TyperCommand, ctx: typer.Context) -> list[Any]:
    own = [p for p in command.get_params(ctx)
           if p.param_type_name == "option" and p.name not in BY_NAME and not getattr(p, "hidden", False)]
    return sorted(own, key=lambda p: "--help" in p.opts)


def _option_lines(option: Any, ctx: typer.Context, cols: int) -> list[str]:
    head = ", ".join(sorted(option.opts, key=len))
    if not option.is_flag:
        head += f" {option.metavar or (option.name or 'value').upper()}"
    return _entry(head, option.help or "", cols)


def usage_lines(ctx: typer.Context, command: typer.core.TyperCommand) -> list[str]:
    lines = [f"{ctx.command_path} {usage_args(command, ctx)}"]
    if not getattr(command, "is_subcommand", False):
        lines += [f"{PROG} {name} {usage_args(sub, ctx)}" for name, sub in COMMANDS.items()]
    return [("Usage: " if i == 0 else "       ") + line for i, line in enumerate(lines)]


def usage_args(command: typer.core.TyperCommand, ctx: typer.Context) -> str:
    declared = getattr(command, "usage_args", None)
    return declared or " ".join(command.collect_usage_pieces(ctx))


def summary(command: typer.core.TyperCommand) -> str:
    first = " ".join((command.help or "").strip().split("\n\n")[0].split())
    cut = min((i for i in (first.find(". "), first.find(": ")) if i >= 0), default=len(first))
    return first[:cut].rstrip(".") + "."


def render(ctx: typer.Context, command: typer.core.TyperCommand) -> str:
    cols, everything = width(), bool(ctx.meta.get(HELP_ALL))
    out = usage_lines(ctx, command) + [""]
    for paragraph in (command.help or "").strip().split("\n\n"):
        out += _wrap(" ".join(paragraph.split()), cols, 0)
        out.append("")
    if COMMANDS and not getattr(command, "is_subcommand", False):
        out.append("Commands:")
        name_width = max(len(n) for n in COMMANDS) + 2
        for name, sub in COMMANDS.items():
            body = textwrap.wrap(summary(sub), cols - 3 - name_width) or [""]
            out.append(f"  {name.ljust(name_width)}{body[0]}")
            out += [" " * (2 + name_width) + line for line in body[1:]]
        out += [f"  (`{PROG} COMMAND --help` for each)", ""]
    arguments = [p for p in command.params if p.param_type_name == "argument" and getattr(p, "help", None)]
    if arguments:
        out.append("Arguments:")
        for argument in arguments:
            out += _entry(argument.metavar or (argument.name or "").upper(), argument.help, cols)
        out.append("")
    out.append("Options:")
    for option in _own_options(command, ctx):
        out += _option_lines(option, ctx, cols)
    settings = [s for s in in_panel_order(SETTINGS) if not s.hidden and (everything or s.common)]
    taken = {p.name for p in command.params}
    settings = [s for s in settings if s.name in taken]
    if everything:
        for panel in PANELS:
            members = [s for s in settings if s.panel == panel]
            if members:
                out += ["", f"{panel}:"]
                for setting in members:
                    out += _entry(setting_head(setting, aliases=True), option_help(setting), cols)
    elif settings:
        out += ["", "Common options:"]
        for setting in settings:
            out += _entry(setting_head(setting, aliases=False), option_help(setting, env=False), cols)
    total = len([s for s in SETTINGS if not s.hidden and s.name in taken])
    if total:
        out += [""] + _wrap(_footer(everything, total), cols, 0)
    return "\n".join(out) + "\n"


def _footer(everything: bool, total: int) -> str:
    spelled = ("torchrun's and ft_launcher's spellings (--max_restarts, --ft-param-rank_heartbeat_timeout) "
               "are accepted too.")
    where = ("Every option can also be set by environment variable (MBR_<NAME>, or torchrun's PET_<NAME>) or "
             "in a --config file; the command line wins.")
    if everything:
        return f"{where} {spelled}"
    return f"`--help-all` lists all {total} options with their environment variables. {where} {spelled}"


class HelpCommand(typer.core.TyperCommand):
    usage_args: str | None = None
    is_subcommand = False

    def format_help(self, ctx: typer.Context, formatter: Any) -> None:
        formatter.write(render(ctx, self))


def _every_option(ctx: typer.Context) -> str:
    ctx.meta[HELP_ALL] = True
    return ctx.get_help()


def help_all_option() -> inspect.Parameter:
    return _eager("help_all", "--help-all", _every_option, "Show every option, with environment variables, and exit.")


def version_option() -> inspect.Parameter:
    return _eager("version", "--version", lambda ctx: version_line(),
                  "Print the versions of mbr-launch, torch, nvidia-resiliency-ext and Python, and exit.")


def _eager(name: str, flag: str, text: Callable[[typer.Context], str], help: str) -> inspect.Parameter:
    """A switch that prints ``text(ctx)`` and exits before the rest of the line is read."""

    def show(ctx: typer.Context, value: bool) -> None:
        if value and not ctx.resilient_parsing:
            typer.echo(text(ctx), color=ctx.color)
            ctx.exit()

    option = typer.Option(flag, is_eager=True, expose_value=False, callback=show, help=help)
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=False, annotation=Annotated[bool, option])
