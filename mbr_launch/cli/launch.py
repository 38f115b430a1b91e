"""``mbr-launch [OPTIONS] SCRIPT [ARGS...]``: build one config from the options, then run this node's agent.

Everything after SCRIPT belongs to the script, as with torchrun.
"""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer

from mbr_launch.api import build_launch_config, launch
from mbr_launch.cli.errors import CommandError
from mbr_launch.cli.helptext import help_all_option, version_option
from mbr_launch.cli.options import USER_ENV, keyword, with_settings
from mbr_launch.config.build import ConfigError


def launch_command(**values: Any) -> None:
    """Launch SCRIPT on this node like torchrun, with hang detection and restarts that work.

    Run one mbr-launch per node (under Slurm: srun --kill-on-bad-exit=0 mbr-launch ...). Everything
    after SCRIPT is passed to the script."""
    script = values.pop("training_script")
    script_args = tuple(values.pop("training_script_args") or ())
    try:
        cfg = build_launch_config(cli=values, script=script, script_args=script_args, environ=USER_ENV)
        # The run folder and the socket folder are checked when the agent makes them: a refusal there is
        # a usage error too (exit 2), not a crash.
        code = launch(cfg, environ=USER_ENV, exit_after=True)
    except ConfigError as err:
        raise CommandError(str(err)) from None
    raise typer.Exit(code)


with_settings(
    launch_command,
    keyword("training_script", None, Annotated[Optional[str], typer.Argument(
        metavar="SCRIPT", show_default=False, help="Training script (or module with -m).")]),
    keyword("training_script_args", None, Annotated[Optional[list[str]], typer.Argument(
        metavar="[ARGS]...", show_default=False, help="Arguments of the script.")]),
    help_all_option(),
    version_option(),
)
