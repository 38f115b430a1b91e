"""The command line: a thin typer layer over ``api``.

``mbr-launch [OPTIONS] SCRIPT [ARGS...]`` launches (everything after SCRIPT belongs to the script, as with
torchrun); ``mbr-launch doctor [OPTIONS]`` checks the environment. The launch options are generated from
``settings.SETTINGS`` so the CLI, the config file, the man page and the completions cannot drift apart.
"""

from __future__ import annotations

import inspect
import os
import sys
import warnings
from typing import Annotated, Any, Optional

import typer

from mbr_launch.report import exitcodes
from rich.markup import escape

from mbr_launch.config.settings import SETTINGS, Setting, default_text, in_panel_order

CONTEXT = {"allow_interspersed_args": False, "help_option_names": ["-h", "--help"]}
DOCTOR = "doctor"


def option_help(setting: Setting) -> str:
    """The help text with the default and environment variables, as shown by --help and the man page."""
    default = default_text(setting)
    parts = [setting.help]
    if setting.kind is not bool and default:
        parts.append(f"[default: {default}]")
    parts.append(f"[env: {', '.join(setting.envvars)}]")
    return " ".join(parts)


def _parameter(setting: Setting) -> inspect.Parameter:
    # escape: rich would read "[default: 1:1]" as a style tag and drop it
    option = typer.Option(*setting.flags, help=escape(option_help(setting)), rich_help_panel=setting.panel,
                          show_default=False, metavar=setting.metavar or None, hidden=setting.hidden)
    kind = Optional[bool] if setting.kind is bool else Optional[str]
    return inspect.Parameter(setting.name, inspect.Parameter.KEYWORD_ONLY, default=None,
                             annotation=Annotated[kind, option])


def _launch(**values: Any) -> None:
    script = values.pop("training_script")
    script_args = tuple(values.pop("training_script_args") or ())
    code = run_launch(values, script, script_args)
    raise typer.Exit(code)


_launch.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [*(_parameter(s) for s in in_panel_order(SETTINGS)),
     inspect.Parameter("training_script", inspect.Parameter.KEYWORD_ONLY, default=None,
                       annotation=Annotated[Optional[str], typer.Argument(metavar="SCRIPT", show_default=False,
                                                                          help="Training script (or module with -m).")]),
     inspect.Parameter("training_script_args", inspect.Parameter.KEYWORD_ONLY, default=None,
                       annotation=Annotated[Optional[list[str]], typer.Argument(metavar="[ARGS]...",
                                                                                show_default=False,
                                                                                help="Arguments of the script.")])])
_launch.__doc__ = """Launch SCRIPT on this node like torchrun, with hang detection and restarts that work.

Run one mbr-launch per node (under Slurm: srun --kill-on-bad-exit=0 mbr-launch ...).
Everything after SCRIPT is passed to the script. `mbr-launch doctor --help` checks a setup."""

app = typer.Typer(add_completion=False, context_settings=CONTEXT, rich_markup_mode="rich",
                  pretty_exceptions_enable=False)
app.command(name="mbr-launch")(_launch)


# The environment as the user gave it, before the launcher adjusts its own (workers get this one).
USER_ENV: dict[str, str] = dict(os.environ)


def run_launch(values: dict[str, Any], script: str | None, script_args: tuple[str, ...]) -> int:
    from mbr_launch.api import build_launch_config, launch
    from mbr_launch.config.errors import ConfigError

    try:
        cfg = build_launch_config(cli=values, script=script, script_args=script_args, environ=USER_ENV)
    except ConfigError as err:
        _error(str(err))
        return exitcodes.USAGE
    return launch(cfg, environ=USER_ENV, exit_after=True)


def _error(message: str) -> None:
    print(f"mbr-launch: error: {message}", file=sys.stderr, flush=True)


def _run_app(application: typer.Typer, argv: list[str], prog: str) -> int:
    try:
        # Without standalone mode the parser returns the command's exit code instead of raising.
        result = application(args=argv, prog_name=prog, standalone_mode=False)
        if isinstance(result, int):
            return result
    except typer.Exit as done:
        return int(done.exit_code)
    except typer.Abort:
        return 128 + 2
    except Exception as err:
        # Usage errors from the parser carry an exit code and a message: show one line, no traceback.
        if hasattr(err, "format_message") and hasattr(err, "exit_code"):
            _error(f"{err.format_message()} (see {prog} --help)")
            return exitcodes.USAGE
        raise
    return exitcodes.OK


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    USER_ENV.clear()
    USER_ENV.update(os.environ)
    # The agent's own store clients time out on purpose (watchers); keep torch's C++ warnings about it
    # out of the user's console. Workers get the user's setting, not this one.
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    # torch.cuda imports the deprecated pynvml that nvidia-resiliency-ext pulls in: not the user's concern.
    warnings.filterwarnings("ignore", message="The pynvml package is deprecated")
    try:
        if argv and argv[0] == DOCTOR:
            from mbr_launch.cli.doctor import doctor_app

            return _run_app(doctor_app, argv[1:], "mbr-launch doctor")
        return _run_app(app, argv, "mbr-launch")
    except KeyboardInterrupt:
        return 130
    except Exception as err:  # a bug of ours: one line unless debugging
        if os.environ.get("MBR_DEBUG"):
            raise
        _error(f"internal error: {type(err).__name__}: {err} (set MBR_DEBUG=1 for the traceback)")
        return exitcodes.INTERNAL


def entry() -> None:
    code = main()
    # Everything of ours is stopped and flushed by now; skip interpreter teardown, where torch's C++
    # objects still referenced by stray threads could abort the process and change the exit code.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
