"""The NVRx the workers will import (whose ft_launcher defaults mbr-launch follows, ``config.nvrx``), the
ft_launcher options given against it (refused by that version: info; ignored by its clients: warn), and the
torch release against the tested range (pyproject's; tests/test_doctor_torch_range.py holds the two together).
"""

from __future__ import annotations

import dataclasses

from packaging.version import InvalidVersion, Version

from mbr_launch.config.nvrx import (CLIENT_FIELDS_SINCE_06, GENERATIONS, NAMES, NEWEST, REMOVED_VALUES, release,
                                   removed_spelling, unclear)
from mbr_launch.config.settings import BY_FLAG, BY_NAME, SETTINGS, default_text
from mbr_launch.doctor.context import DoctorContext
from mbr_launch.doctor.inprocess import version_or_none
from mbr_launch.doctor.registry import Finding, check, error, info, ok, skip, warn

MIN_NVRX = Version("0.4.1")
NVRX_IPR_DEPRECATED = Version("0.6.0")
# What mbr-launch does with a value that a newer ft_launcher refuses.
_KEPT = {"restart_policy": "keeps it: a crashed rank is left to in-process restart until fewer than MIN nodes "
                           "are whole"}


def defaults_followed(line: str | None) -> str:
    """The defaults that depend on the workers' NVRx line, as 'key value, ...' (YAML key names)."""
    parts = []
    for setting in SETTINGS:
        if setting.nvrx_defaults:
            value = setting.default_for(line)
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            text = default_text(dataclasses.replace(setting, default=value)) or "none"
            parts.append(f"{setting.ft_key or setting.name} {text}")
    return ", ".join(parts)


@check("versions.nvrx", "nvidia-resiliency-ext the workers import")
def nvrx_version(ctx: DoctorContext) -> Finding:
    found = ctx.workers_nvrx
    needed = ctx.ft_declared or ctx.ipr is not None
    if found.version is None:
        saw = "nvidia-resiliency-ext is not installed in the workers' environment (PYTHONPATH, then the launcher's)"
        fix = f"pip install 'nvidia-resiliency-ext>={MIN_NVRX}'"
        if needed:
            return error(saw + " but fault tolerance or in-process restart is configured", fix)
        return warn(saw, fix)
    nv, line = version_or_none(found.version), found.generation
    if nv is not None and nv < MIN_NVRX:
        return warn(f"nvidia-resiliency-ext {found.version} is older than tested ({MIN_NVRX}), in {found.where}",
                    f"pip install 'nvidia-resiliency-ext>={MIN_NVRX}'")
    name = NAMES.get(line or "", line)
    newer = nv is not None and nv.release[:2] > release(NEWEST)
    saw = (f"{found.describe()}; for the options not given, mbr-launch follows ft_launcher {name}'s defaults"
           + (" (the newest line it knows)" if newer else "") + f": {defaults_followed(line)}")
    if ctx.ipr and nv is not None and nv >= NVRX_IPR_DEPRECATED:
        return info(f"{saw}. In-process restart is deprecated since 0.6",
                    "plan a move to in-job restart (mbr-launch restarts workers itself)")
    return ok(saw)


def _reading(name: str, raw: object, line: str | None) -> object:
    parse = BY_NAME[name].parse
    by_line = getattr(parse, "for_generation", None)
    return (by_line(line) if by_line else parse)(raw) if parse else raw  # type: ignore[operator]


@check("launcher.ft_options", "ft_launcher options against the workers' NVRx")
def ft_options(ctx: DoctorContext) -> Finding:
    found, line = ctx.workers_nvrx, ctx.workers_nvrx.generation
    if not ctx.ft_given and not ctx.flags:
        return skip("no ft_launcher options given")
    if line is None:
        return skip("no nvidia-resiliency-ext in the workers' environment (no NVRx client to read the options)")
    version = found.version
    notes: list[str] = []
    problems: list[str] = []
    fixes: list[str] = []

    def spelled(name: str) -> str:  # the option as the user typed it, where the command line is known
        return next((f for f in ctx.flags if BY_FLAG.get(f) is BY_NAME[name]), BY_NAME[name].flag)

    for flag in dict.fromkeys(ctx.flags):
        gone = removed_spelling(flag)
        if gone and release(line) >= release(gone) and flag in BY_FLAG:
            notes.append(f"{flag}: ft_launcher {gone}+ refuses it (the workers have NVRx {version}); mbr-launch "
                         f"accepts it as {BY_FLAG[flag].flag}")
    for name, raw in ctx.ft_given.items():
        setting = BY_NAME[name]
        gone = REMOVED_VALUES.get((name, str(raw).strip().lower()))
        if gone and release(line) >= release(gone):
            notes.append(f"{spelled(name)} {raw}: ft_launcher {gone}+ refuses it; mbr-launch "
                         + _KEPT.get(name, "accepts it (no effect here)"))
        if line == GENERATIONS[0] and setting.ft_key in CLIENT_FIELDS_SINCE_06:
            problems.append(f"{spelled(name)}: NVRx {version} clients ignore it (NVRx 0.6 added it)")
            fixes.append("give the workers nvidia-resiliency-ext>=0.6, or drop the option")
        lenient = getattr(setting.parse, "rule", None) or getattr(setting.parse, "for_generation", None)
        if lenient and unclear(raw):
            problems.append(f"{spelled(name)} {raw!r} is read as {str(_reading(name, raw, line)).lower()}, as the "
                            f"ft_launcher of NVRx {version} reads it")
            fixes.append("write true or false to say which")
    if problems:
        return warn("; ".join(problems + notes), "; ".join(dict.fromkeys(fixes)))
    if notes:
        return info("; ".join(notes))
    return ok(f"every ft_launcher option given means the same to NVRx {version}'s ft_launcher")


# (major, minor) releases the torch-touching tests ran on (benchmarks/RESULTS.md, "Issue #38: torch versions").
TORCH_OLDEST: tuple[int, int] = (2, 13)
TORCH_NEWEST: tuple[int, int] = (2, 14)
# as pyproject declares it
REQUIREMENT = f"torch>={TORCH_OLDEST[0]}.{TORCH_OLDEST[1]},<{TORCH_NEWEST[0]}.{TORCH_NEWEST[1] + 1}"


def in_tested_range(version: str) -> bool | None:
    """Whether torch's ``__version__`` is in the tested range; None when it is not a version at all."""
    try:
        parts = Version(version).release
    except InvalidVersion:
        return None
    return TORCH_OLDEST <= (parts + (0, 0))[:2] <= TORCH_NEWEST


@check("versions.torch_tested", "torch release against the versions mbr-launch was tested with")
def torch_tested(ctx: DoctorContext) -> Finding:
    version = ctx.versions().torch
    if version is None:
        return skip("torch cannot be imported (see versions.torch)")
    span = f"{TORCH_OLDEST[0]}.{TORCH_OLDEST[1]} to {TORCH_NEWEST[0]}.{TORCH_NEWEST[1]}"
    verdict = in_tested_range(version)
    if verdict:
        return ok(f"torch {version}: within the tested {span}")
    saw = (f"torch {version} is not a version mbr-launch can place" if verdict is None else
           f"torch {version} is outside the versions mbr-launch was tested with ({span})")
    return warn(saw, "it may well work; to be sure, run the torch-touching tests on it from a checkout of "
                     f"mbr-launch (scripts/torch-compat {version.split('+')[0]}), or use a tested torch: "
                     f"pip install '{REQUIREMENT}'")
