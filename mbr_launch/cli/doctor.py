"""``mbr-launch doctor [launch options] [--json] [--deep]``: the checks, without launching anything."""

from __future__ import annotations

import inspect
import sys
from typing import Annotated, Any, Optional

import typer

from mbr_launch.report import exitcodes
from mbr_launch.cli.app import CONTEXT, USER_ENV, _error, _parameter
from mbr_launch.config.settings import SETTINGS, in_panel_order


def _doctor(**values: Any) -> None:
    from mbr_launch.api import doctor_context, resolve_settings
    from mbr_launch.config.build import preflight_spec
    from mbr_launch.config.errors import ConfigError
    from mbr_launch.doctor import DoctorError, detect_launcher, run_doctor

    as_json, deep = bool(values.pop("json")), bool(values.pop("deep"))
    values.pop("training_script", None)
    try:
        resolved = resolve_settings(cli=values, environ=USER_ENV)
        launcher = detect_launcher(USER_ENV)
        ctx = doctor_context(preflight_spec(resolved), environ=USER_ENV,
                             launcher="mbr-launch" if launcher == "none" else launcher)
        skip = {s for s in resolved["skip_check"] if s != "all"}
        code = run_doctor(ctx, deep=deep, as_json=as_json, skip=skip)
    except (ConfigError, DoctorError) as err:
        _error(str(err))
        code = exitcodes.USAGE
    raise typer.Exit(code)


_doctor.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [*(_parameter(s) for s in in_panel_order(SETTINGS)),
     inspect.Parameter("json", inspect.Parameter.KEYWORD_ONLY, default=False,
                       annotation=Annotated[bool, typer.Option("--json", help="Print the results as JSON.")]),
     inspect.Parameter("deep", inspect.Parameter.KEYWORD_ONLY, default=False,
                       annotation=Annotated[bool, typer.Option(
                           "--deep", help="Also run a short NCCL all-reduce and GEMM test on the local GPUs.")]),
     inspect.Parameter("training_script", inspect.Parameter.KEYWORD_ONLY, default=None,
                       annotation=Annotated[Optional[list[str]], typer.Argument(
                           metavar="[SCRIPT [ARGS]...]", show_default=False,
                           help="Ignored: accepted so a launch command line can be checked as it is.")])])
_doctor.__doc__ = """Check the environment and configuration of a launch without starting it.

Takes the same options as a launch. Exit code: 0 all ok, 1 warnings, 2 errors."""

doctor_app = typer.Typer(add_completion=False, context_settings=CONTEXT, rich_markup_mode="rich",
                         pretty_exceptions_enable=False)
doctor_app.command(name="doctor")(_doctor)

__all__ = ["doctor_app", "sys"]
