"""The man page, mbr-launch(1), in roff."""

from __future__ import annotations

from typing import Sequence

from mbr_launch.cli.helptext import option_help
from mbr_launch.config.settings import Setting
from mbr_launch.report import exitcodes

from .common import DOCTOR_ABOUT, DOCTOR_USAGE, GENERATED, HELP_FLAGS, by_panel, long_flag, subcommands, visible


def _roff(text: str) -> str:
    """Escape running text; a leading '.' or "'" would otherwise start a request."""
    text = text.replace("\\", "\\e")
    return "\\&" + text if text[:1] in (".", "'") else text


def _roff_flag(flag: str) -> str:
    # \- is a real minus, so flags copied from the rendered page work in a shell.
    return "\\fB" + flag.replace("-", "\\-") + "\\fR"


def _roff_usage(usage: str) -> str:
    return _roff(usage).replace("-", "\\-")


def _man_option(setting: Setting) -> list[str]:
    # Each spelling once: torchrun's underscore twins are accepted, and said so once in DESCRIPTION.
    tag = ", ".join(_roff_flag(f) for f in setting.shown_flags)
    if meta := setting.value_hint:
        tag += " \\fI" + _roff(meta) + "\\fR"
    return [".TP", tag, _roff(option_help(setting))]


def _example(title: str, *lines: str) -> list[str]:
    return [".PP", _roff(title), ".PP", ".RS 4", ".nf", *(_roff(line) for line in lines), ".fi", ".RE"]


def render(settings: Sequence[Setting]) -> str:
    """The man page of mbr-launch(1) for these settings."""
    out = [
        f'.\\" {GENERATED}',
        '.TH MBR-LAUNCH 1 "" "mbr-launch" "User Commands"',
        ".nh",  # no hyphenation: flags must not be split at their dashes
        ".ad l",
        ".SH NAME",
        "mbr\\-launch \\- fault\\-tolerant drop\\-in replacement for torchrun",
        ".SH SYNOPSIS",
        ".B mbr\\-launch",
        "[\\fIOPTIONS\\fR] \\fISCRIPT\\fR [\\fIARGS\\fR...]",
        ".br",
        _roff_usage(DOCTOR_USAGE),
        *(line for sub in subcommands() if sub.name != "doctor"
          for line in (".br", _roff_usage(f"mbr-launch {sub.name} [OPTIONS]"))),
        ".br",
        _roff_usage("mbr-launch --help | --help-all | --version"),
        ".SH DESCRIPTION",
        "Run one \\fBmbr\\-launch\\fR per node, as you would run torchrun. It joins a rendezvous, starts one "
        "worker per GPU, watches each rank's heartbeats and sections, stops and restarts the workers when a "
        "rank hangs or crashes, and forwards signals. Everything after \\fISCRIPT\\fR is passed to the script.",
        ".PP",
        "torchrun's and ft_launcher's flags are accepted as they are, torchrun's underscore spellings "
        "(\\-\\-max_restarts) and ft_launcher's (\\-\\-ft\\-param\\-rank_heartbeat_timeout) too; this page lists each "
        "option once. \\-\\-help shows the common options, \\-\\-help\\-all all of them, "
        "\\-\\-version the versions of mbr\\-launch, torch, nvidia\\-resiliency\\-ext and Python. "
        "Each option can also be set by "
        "environment variable or in the config file; the command line wins over the environment "
        "(MBR_* before PET_*), which wins over the config file, which wins over the default. An empty "
        "environment variable is an error, except for a setting whose default is empty, where it means unset.",
        ".SH OPTIONS",
        ".TP",
        ", ".join(_roff_flag(f) for f in HELP_FLAGS),
        "Show the common options and exit.",
        ".TP",
        _roff_flag("--help-all"),
        "Show every option, with its environment variables and other spellings, and exit.",
        ".TP",
        _roff_flag("--version"),
        "Print the versions of mbr\\-launch, torch, nvidia\\-resiliency\\-ext and Python, and exit.",
    ]
    for panel, members in by_panel(settings):
        out += [f'.SS "{panel}"']
        for setting in members:
            out += _man_option(setting)
    out += [".SH DOCTOR", _roff_usage(DOCTOR_USAGE), ".PP", _roff(DOCTOR_ABOUT), ".SH EXIT STATUS"]
    for code, meaning in exitcodes.TABLE:
        out += [".TP", f"\\fB{code}\\fR", _roff(meaning)]
    out += [".SH ENVIRONMENT"]
    for setting in visible(settings):
        out += [".TP", ", ".join(f"\\fB{e}\\fR" for e in setting.envvars),
                "Same as " + _roff_flag(long_flag(setting)) + "."]
    out += [".TP", "\\fBMBR_DEBUG\\fR", "Set to 1 to see the traceback of an internal error (exit status 4)."]
    out += [
        ".SH FILES",
        "The YAML file given with " + _roff_flag("--config") + " has two optional sections. "
        "\\fBmbr_launch:\\fR takes every setting but config by its name, e.g. nproc_per_node "
        "(dashes are accepted too). \\fBfault_tolerance:\\fR is ft_launcher's section, read as it is; "
        "its keys are:",
        ".PP",
        ".RS 4",
    ]
    for setting in (s for s in visible(settings) if s.ft_key):
        out += [f"\\fB{setting.ft_key}\\fR ({_roff_flag(setting.flag)})", ".br"]
    out += [".RE"]
    out += _example("For example:", "mbr_launch:", "  nproc_per_node: 8", "  max_restarts: 3",
                    "fault_tolerance:", "  rank_heartbeat_timeout: 600",
                    "  rank_section_timeouts: {setup: 600, step: 180}")
    out += [".SH EXAMPLES"]
    out += _example("One node, eight GPUs, like torchrun --standalone:",
                    "mbr-launch --standalone --nproc-per-node=8 train.py --lr 3e-4")
    out += _example("Four nodes with a c10d rendezvous (run the same line on every node):",
                    "mbr-launch --nnodes=4 --nproc-per-node=8 --max-restarts=3 \\",
                    "    --rdzv-backend=c10d --rdzv-endpoint=node0:29400 --rdzv-id=job42 \\",
                    "    train.py")
    out += _example("Under Slurm, one launcher per node; --kill-on-bad-exit=0 keeps srun from killing the "
                    "other nodes while they restart:",
                    "srun --nodes=4 --ntasks-per-node=1 --kill-on-bad-exit=0 \\",
                    "    mbr-launch --nnodes=4 --nproc-per-node=8 --rdzv-backend=c10d \\",
                    "    --rdzv-endpoint=$HEAD_NODE:29400 --rdzv-id=$SLURM_JOB_ID train.py")
    out += _example("Coming from ft_launcher: replace the command, keep the flags and the YAML file:",
                    "mbr-launch --ft-cfg-path=ft.yaml --ft-param-rank_heartbeat_timeout=600 \\",
                    "    --nproc-per-node=8 --max-restarts=3 train.py")
    out += [".SH SEE ALSO", "\\fBtorchrun\\fR, \\fBsrun\\fR(1), \\fBpy\\-spy\\fR(1), and README.md of mbr\\-launch."]
    return "\n".join(out) + "\n"
