"""Whether the torch in use is one mbr-launch was tested with.

mbr-launch leans on torch's elastic agent, c10d rendezvous and some of its private parts
(``cluster.torch_internals``), so a torch release it was never run against may launch and still behave
differently. Users bring their own torch; this check names one outside the tested range as a warning (a
launch is not refused: an untested torch is not known to be broken). The range is pyproject's torch
requirement, and tests/test_doctor_torch_range.py holds the two to each other.
"""

from __future__ import annotations

from packaging.version import InvalidVersion, Version

from mbr_launch.doctor.context import DoctorContext
from mbr_launch.doctor.registry import Finding, check, ok, skip, warn

# (major, minor) releases, oldest and newest, that the torch-touching tests ran on: 2.13 in CI (scripts/test:
# the whole suite, torch 2.13.0 CPU wheel), 2.14 by scripts/torch-compat 2.14.1 (benchmarks/RESULTS.md,
# "Issue #38: torch versions": all passed but torchrun 2.14's two new flags).
OLDEST: tuple[int, int] = (2, 13)
NEWEST: tuple[int, int] = (2, 14)
REQUIREMENT = f"torch>={OLDEST[0]}.{OLDEST[1]},<{NEWEST[0]}.{NEWEST[1] + 1}"  # as pyproject declares it


def in_tested_range(version: str) -> bool | None:
    """Whether ``version`` (torch's ``__version__``: local and pre-release parts allowed) is in the tested
    range; None when it is not a version at all."""
    try:
        release = Version(version).release
    except InvalidVersion:
        return None
    return OLDEST <= (release + (0, 0))[:2] <= NEWEST


@check("versions.torch_tested", "torch release against the versions mbr-launch was tested with")
def torch_tested(ctx: DoctorContext) -> Finding:
    version = ctx.versions().torch
    if version is None:
        return skip("torch cannot be imported (see versions.torch)")
    span = f"{OLDEST[0]}.{OLDEST[1]} to {NEWEST[0]}.{NEWEST[1]}"
    verdict = in_tested_range(version)
    if verdict:
        return ok(f"torch {version}: within the tested {span}")
    saw = (f"torch {version} is not a version mbr-launch can place" if verdict is None else
           f"torch {version} is outside the versions mbr-launch was tested with ({span})")
    return warn(saw, "it may well work; to be sure, run the torch-touching tests on it from a checkout of "
                     f"mbr-launch (scripts/torch-compat {version.split('+')[0]}), or use a tested torch: "
                     f"pip install '{REQUIREMENT}'")
