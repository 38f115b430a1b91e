"""The fault matrix (issue 16), one test per case of testkit/fault_cases.py: real agents, real workers, real
signals; each case must end as its table row says (survived, or the documented exit code), with the fault in
events.jsonl and no process left behind (the autouse fixture in conftest.py; a killed agent's orphans are
checked by the case). Cases that need root, network namespaces or the Slurm test cluster carry the
``netns`` / ``slurm`` markers and skip where those are missing, as test_network_cut.py and
test_slurm_launch.py do."""

from __future__ import annotations

import os

import pytest

from testkit import netns
from testkit.fault_cases import CASES
from testkit.fault_runs import Ctx
from testkit.fault_spec import Case, verify
from testkit.helpers import launcher_env

pytestmark = [pytest.mark.timeout(150), pytest.mark.processes]


def _param(case: Case):
    marks = [getattr(pytest.mark, need) for need in case.needs if need in ("netns", "slurm")]
    if "root" in case.needs and os.geteuid() != 0:
        marks.append(pytest.mark.skip(reason="needs root"))
    if "netns" in case.needs and (why := netns.available()):
        marks.append(pytest.mark.skip(reason=why))
    if case.tested_by:
        marks.append(pytest.mark.skip(reason=f"run and checked by {case.tested_by}"))
    if case.known_bug:
        marks.append(pytest.mark.xfail(strict=True, raises=AssertionError, reason=case.known_bug))
    return pytest.param(case, id=case.name, marks=marks)


@pytest.mark.parametrize("case", [_param(c) for c in CASES])
def test_fault(case: Case, tmp_path, request):
    cluster = request.getfixturevalue("slurm_clean") if "slurm" in case.needs else None
    run = case.run(Ctx(tmp_path, launcher_env(), cluster=cluster))
    problems = verify(case, run)
    pending = f" (expected to pass once {case.pending})" if case.pending and problems else ""
    assert not problems, f"{case.name}: {case.fault}{pending}\n- " + "\n- ".join(problems) + "\n" + run.tail()
