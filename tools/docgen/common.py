"""What every generator needs to know about the settings: which are shown, how a flag takes its value, and
the doctor subcommand's own flags."""

from __future__ import annotations

import re
from typing import Sequence

import mbr_launch.cli.app  # noqa: F401 - registers the subcommands (helptext.COMMANDS) that the completions list
# What the completions need is in the package (``mbr-launch --print-completion`` prints them); re-exported here.
from mbr_launch.cli.completion import (GENERATED, HELP_FLAGS, LAUNCH_ONLY, Option, Subcommand, completes,  # noqa: F401
                                       subcommands, value_flags, visible)
from mbr_launch.config.settings import PANELS, Setting, default_text

# The doctor subcommand's own flags (mbr_launch/cli/doctor.py): this line is the one place to update when
# they change. Its flags feed the completions, so keep the [--flag METAVAR] shape.
DOCTOR_USAGE = ("mbr-launch doctor [launch options] [--json] [--deep] [--verbose] [--all] [--config FILE] "
                "[--skip-check ID]")
DOCTOR_ABOUT = ("Check the environment before launching: the same launch options describe the job, and "
                "each check reports what is wrong and how to fix it, grouped by area; the checks that do not "
                "apply are folded into one line per area (--verbose lists them). The first line, and 'versions' "
                "in --json, give the versions for a bug report; versions.nvrx names the NVRx the workers will "
                "import (PYTHONPATH first), whose defaults mbr-launch follows where ft_launcher versions differ, "
                "and launcher.ft_options the options that version's ft_launcher refuses or its clients ignore. "
                "--deep also runs a real collective: GEMM and NCCL all-reduce on the local GPUs, or a gloo "
                "all-reduce across two local processes without a GPU. A launch runs the cheap checks first: "
                "errors stop it, warnings are one line. Exit status 0 all ok, 1 warnings, 2 errors, 3 the checks "
                "could not run (a bad option or config file; with --json the reason is in 'error').")


def by_panel(settings: Sequence[Setting]) -> list[tuple[str, list[Setting]]]:
    """The visible settings grouped by panel, in PANELS order; empty panels left out."""
    groups = [(panel, [s for s in visible(settings) if s.panel == panel]) for panel in PANELS]
    return [(panel, members) for panel, members in groups if members]  # Slurm has no settings yet


def long_flag(setting: Setting) -> str:
    return next((f for f in setting.flags if f.startswith("--")), setting.flag)


def default_shown(setting: Setting) -> str:
    return default_text(setting)


def doctor_flags() -> list[tuple[str, str]]:
    """(flag, metavar) pairs of DOCTOR_USAGE; metavar is "" for switches."""
    return re.findall(r"\[(--[\w-]+)(?: ([A-Z]+))?\]", DOCTOR_USAGE)


def doctor_only_flags(settings: Sequence[Setting]) -> list[tuple[str, str]]:
    launch = {f for s in visible(settings) for f in s.flags}
    return [(flag, meta) for flag, meta in doctor_flags() if flag not in launch]
