"""``mbr-launch doctor [launch options] [--json] [--deep]``: the checks, without launching anything."""

from __future__ import annotations

import inspect
import sys
from typing import Annotated, Any, Optional

import typer

from mbr_launch.api import doctor_context, resolve_settings
from mbr_launch.cli.helptext import help_all_option, keyword, with_settings
from mbr_launch.cli.process import USER_ENV, CommandError
from mbr_launch.config.build import preflight_spec
from mbr_launch.config.errors import ConfigError
from mbr_launch.config.settings import SETTINGS
from mbr_launch.report.exitcodes import DOCTOR_NOT_RUN

ARGV = "argv"  # ctx.obj key: the command line as typed (cli.app)
_VALUE_FLAGS = frozenset(f for s in SETTINGS if s.takes_value for f in s.flags)


def option_strings(argv: tuple[str, ...]) -> tuple[str, ...]:
    """The option strings before the script (``--ft-param-safety_factor=3`` gives ``--ft-param-safety_factor``), so
    the checks can tell which of ft_launcher's spellings were used."""
    found, i = [], 0
    while i < len(argv) and argv[i].startswith("-") and argv[i] != "--":
        name, equals, _ = argv[i].partition("=")
        found.append(name)
        i += 2 if name in _VALUE_FLAGS and not equals else 1
    return tuple(found)


def doctor_command(**values: Any) -> None:
    """Check the environment and configuration of a launch without starting it.

    Takes the same options as a launch. The NVRx version reported is the one the workers will import
    (PYTHONPATH first, then the launcher's own environment); ft_launcher's options are checked against it.
    Exit code: 0 all ok, 1 warnings, 2 errors, 3 the checks could not run (a bad option or config file;
    with --json the JSON says why)."""
    # Imported here, not at the top: the launch command must reach ``api.launch``, which starts the warm
    # standbys, without first loading every doctor check (cold-launch time).
    from mbr_launch.doctor import DoctorError, detect_launcher, run_doctor

    as_json, deep, verbose = bool(values.pop("json")), bool(values.pop("deep")), bool(values.pop("verbose"))
    context = values.pop("ctx")
    argv = context.obj.get(ARGV, ()) if isinstance(context.obj, dict) else ()
    script, *script_args = values.pop("training_script", None) or [None]
    try:
        resolved = resolve_settings(cli=values, environ=USER_ENV)
        launcher = detect_launcher(USER_ENV)
        spec = preflight_spec(resolved, script=script, script_args=tuple(script_args), flags=option_strings(argv))
        ctx = doctor_context(spec, environ=USER_ENV,
                             launcher="mbr-launch" if launcher == "none" else launcher)
        skip = {s for s in resolved["skip_check"] if s != "all"}
        code = run_doctor(ctx, deep=deep, as_json=as_json, skip=skip, verbose=verbose)
    except (ConfigError, DoctorError) as err:
        if as_json:
            print_json_error(str(err))
        raise CommandError(str(err), code=DOCTOR_NOT_RUN) from None
    raise typer.Exit(code)


def print_json_error(message: str) -> None:
    """``doctor --json`` prints JSON whatever happens: a script reading it gets the reason, not nothing."""
    from mbr_launch.doctor import to_json

    if sys.stdout is None:  # started with stdout closed
        return
    try:
        print(to_json([], error=message), flush=True)
    except OSError:  # nobody reads it any more (`| head`): the exit code still says it
        pass


with_settings(
    doctor_command,
    inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context),
    keyword("json", False, Annotated[bool, typer.Option("--json", help="Print the results as JSON.")]),
    keyword("deep", False, Annotated[bool, typer.Option(
        "--deep", help="Also run a real collective self-test: GEMM and NCCL all-reduce on the local GPUs, or a "
                       "gloo all-reduce across local processes without a GPU.")]),
    keyword("verbose", False, Annotated[bool, typer.Option(
        "--verbose", "--all", "-v", help="Show every check, the skipped ones too (folded into one line per "
                                         "area otherwise).")]),
    keyword("training_script", None, Annotated[Optional[list[str]], typer.Argument(
        metavar="[SCRIPT [ARGS]...]", show_default=False,
        help="The launch's script and its arguments, as given to a launch: the in-process-restart checks "
             "look for NVRx's inprocess package in it and for --inprocess-restart.")]),
    help_all_option(),
)
