"""``mbr-launch [OPTIONS] SCRIPT [ARGS...]``: build one config from the options, then run this node's agent."""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer

from mbr_launch.cli import plainline
from mbr_launch.cli.completion import completion_option
from mbr_launch.cli.helptext import help_all_option, keyword, version_option, with_settings


def launch_command(**values: Any) -> None:
    """Launch SCRIPT on this node like torchrun, with hang detection and restarts that work.

    Run one mbr-launch per node (under Slurm: srun --kill-on-bad-exit=0 mbr-launch ...). Everything
    after SCRIPT is passed to the script."""
    raise typer.Exit(plainline.launch(values))  # the same launch as a plain command line's, read by typer


with_settings(
    launch_command,
    keyword("training_script", None, Annotated[Optional[str], typer.Argument(
        metavar="SCRIPT", show_default=False, help="Training script (or module with -m).")]),
    keyword("training_script_args", None, Annotated[Optional[list[str]], typer.Argument(
        metavar="[ARGS]...", show_default=False, help="Arguments of the script.")]),
    help_all_option(),
    version_option(),
    completion_option(),
)
