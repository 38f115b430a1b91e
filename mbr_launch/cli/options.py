"""Command-line options generated from the settings table (``config.settings.SETTINGS``)."""

from __future__ import annotations

import inspect
from typing import Annotated, Any, Callable, Optional

import typer
from rich.markup import escape

from mbr_launch.config.settings import SETTINGS, Setting, default_text, in_panel_order


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
