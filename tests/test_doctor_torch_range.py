"""``versions.torch_tested``: a torch outside the tested range is named, as a warning with what to do; the
range is the one pyproject declares (the torch version is injected; everything else is the real doctor)."""

from __future__ import annotations

import json
import re

import pytest

from mbr_launch.doctor import DoctorContext, run_checks, to_json
from mbr_launch.doctor.probes import Versions
from mbr_launch.doctor.nvrx_compat import REQUIREMENT, in_tested_range
from testkit.helpers import REPO

pytestmark = pytest.mark.timeout(30)


def check(torch: str | None) -> dict:
    versions = Versions(torch=torch, nccl=None, nvrx="0.4.1", cuda=None, torch_error="" if torch else "ImportError: x")
    c = DoctorContext.from_values(env={}, versions=lambda: versions, other_launchers=lambda: [])
    report = json.loads(to_json(run_checks(c)))
    [found] = [r for r in report["checks"] if r["id"] == "versions.torch_tested"]
    return found


@pytest.mark.parametrize("torch", ["2.13.0", "2.13.0+cpu", "2.14.1", "2.14.1+cu130", "2.14.0", "2.14.3"])
def test_a_tested_release_is_ok(torch):
    r = check(torch)
    assert r["severity"] == "ok" and torch in r["saw"] and "2.13 to 2.14" in r["saw"], r


@pytest.mark.parametrize("torch", ["2.11.0+cu130", "2.3.1", "2.12.1", "2.15.0", "2.15.0.dev20261201+cu130", "3.0.0"])
def test_an_untested_release_is_named_as_a_warning_with_what_to_do(torch):
    r = check(torch)
    assert r["severity"] == "warn", r
    assert f"torch {torch} is outside the versions mbr-launch was tested with (2.13 to 2.14)" == r["saw"]
    assert f"scripts/torch-compat {torch.split('+')[0]}" in r["fix"] and "pip install 'torch>=2.13,<2.15'" in r["fix"]


def test_a_version_that_is_no_version_is_a_warning_and_missing_torch_is_left_to_versions_torch():
    r = check("banana")
    assert r["severity"] == "warn" and "torch banana is not a version" in r["saw"] and r["fix"]
    assert in_tested_range("banana") is None
    r = check(None)
    assert r["severity"] == "skip" and "versions.torch" in r["saw"]


def test_the_range_is_the_one_pyproject_declares():
    # A plain read (tomllib is Python 3.11+): the dependency lines are one quoted requirement each.
    [torch] = re.findall(r'^\s*"(torch\b[^"]*)"', (REPO / "pyproject.toml").read_text(), re.MULTILINE)
    assert torch.replace(" ", "") == REQUIREMENT
