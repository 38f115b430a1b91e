"""A SIGTERM that reaches one agent stops that node, and the others go on per the restart policy, as under
ft_launcher (issue #42); a signal every agent gets still stops the job; the store's host is the exception.

The restart-policy tables are NVRx's own functional tests of ft_launcher's ``--ft-restart-policy`` (agents of 2
CPU ranks, ``--nnodes=2:3``, agents ended with a plain ``kill`` and new ones started as spares), run by mbr-launch
and by ft_launcher 0.4.1 where it is installed, with the same counts asserted at each step: runs of the job
(rank 0 starts), live ranks, live agents; then every agent's exit code at the workers' time limit. The codes of
the agents that were ended differ, as documented: mbr-launch's exit 6 ("this node left the job"); ft_launcher's
exit 0 when its ranks left cleanly, and a spare, which installs no handler before it runs workers, dies of the
SIGTERM (-15).
"""

from __future__ import annotations

import signal
import subprocess
import sys
from importlib import metadata

import pytest

from testkit.helpers import free_port, launcher_env, run_events
from testkit.node_table import SETTLE, WAIT, Job, Step, ft_launcher

pytestmark = [pytest.mark.processes, pytest.mark.timeout(300)]

NPROC = 2  # ranks per agent (node): the table's world of 6 and 4
ANY_FAILED = (
    Step("spare", 1, 3 * NPROC, 4, quiet=True, what="a spare joins: nothing moves"),
    Step("kill 2", 2, 3 * NPROC, 3, what="an active agent terminated: restarted with the spare"),
    Step("kill 3", 2, 2 * NPROC, 2, quiet=True, what="another terminated, no spare: not restarted"),
    Step("spare", 3, 3 * NPROC, 3, what="a new agent while there is room: the round re-forms with it"),
    Step("spare", 3, 3 * NPROC, 4, quiet=True, what="one more, a spare (3 = MAX): not interrupted"),
    Step("kill 5", 3, 3 * NPROC, 3, quiet=True, what="that spare terminated: not affected"),
)
MIN_HEALTHY = (
    Step("spare", 1, 3 * NPROC, 4, quiet=True, what="a spare joins: nothing moves"),
    Step("kill 1", 1, 2 * NPROC, 3, quiet=True, what="an active agent terminated: 2 nodes still healthy, not restarted"),
    Step("spare", 1, 2 * NPROC, 4, quiet=True, what="a new spare: not interrupted (min-healthy admits at restarts)"),
    Step("kill 2", 2, 3 * NPROC, 3, what="another active terminated: 1 healthy < 2, restarted with the spares"),
    Step("kill 4", 2, 2 * NPROC, 2, quiet=True, what="an active agent terminated: 2 still healthy, not restarted"),
    Step("spare 2", 2, 2 * NPROC, 4, quiet=True, what="two more spares: not interrupted"),
)
TABLES = {"any-failed": (ANY_FAILED, "5"), "min-healthy": (MIN_HEALTHY, "1")}
# Every agent's exit code at the time limit, in start order.
CODES = {
    ("mbr-launch", "any-failed"): [0, 0, 6, 6, 0, 6],
    ("mbr-launch", "min-healthy"): [0, 6, 6, 0, 6, 0, 0],
    ("ft_launcher", "any-failed"): [0, 0, 0, 0, 0, -signal.SIGTERM],
    ("ft_launcher", "min-healthy"): [0, 0, 0, 0, 0, 0, 0],
}


def _ft_launcher() -> str:
    path = ft_launcher()
    if path is None:
        pytest.skip("ft_launcher (nvidia-resiliency-ext) is not installed")
    version = metadata.version("nvidia-resiliency-ext")
    if version != "0.4.1":
        pytest.skip(f"the table's codes are ft_launcher 0.4.1's; nvidia-resiliency-ext {version} is installed")
    return path


@pytest.mark.parametrize("policy", TABLES)
@pytest.mark.parametrize("launcher", ["mbr-launch", pytest.param("ft_launcher", marks=pytest.mark.reference)])
def test_restart_policy_table(tmp_path, launcher, policy):
    table, max_restarts = TABLES[policy]
    job = Job(tmp_path, "mbr-launch" if launcher == "mbr-launch" else _ft_launcher(),
              [f"--max-restarts={max_restarts}",
               f"--{'ft-' if launcher == 'ft_launcher' else ''}restart-policy={policy}"], nproc=NPROC)
    try:
        for i in range(3):
            job.start(host=i == 0)
        job.wait_until(lambda: job.counts() == (1, 3 * NPROC, 3), "the first round of 3 agents")
        for step in table:
            job.step(step)
        codes = job.end()
    finally:
        job.close()
    assert codes == CODES[(launcher, policy)], (codes, job.tails())
    assert job.world() == 0
    if launcher == "mbr-launch":
        ended = [i for i, code in enumerate(codes) if code == 6]
        for i in ended:
            assert "it leaves the job" in job.output(i), job.output(i)[-3000:]
        # the nodes that stayed never took a departure for a lost peer
        assert not any("silent" in job.output(i) for i in range(len(codes))), job.tails()


def test_the_store_host_terminated_ends_the_job_with_exit_3(tmp_path):
    """The agent that serves the rendezvous store (c10d, is_host) gets SIGTERM alone: it cannot leave without the
    store, so its signal ends the job: every node stops its workers and exits 3, saying why and what to do."""
    job = Job(tmp_path, "mbr-launch", ["--max-restarts=2"], nproc=1)
    try:
        for i in range(3):
            job.start(host=i == 0)
        job.wait_until(lambda: job.counts() == (1, 3, 3), "the first round of 3 agents")
        job.kill(0)
        codes = job.end()
    finally:
        job.close()
    assert codes == [3, 3, 3], (codes, job.tails())
    assert job.world() == 0 and job.runs() == 1
    for i in range(3):
        assert "serves the rendezvous store" in job.output(i) and "mbr-launch store" in job.output(i), job.output(i)


def test_with_the_store_apart_the_job_goes_on_and_a_signal_to_every_agent_stops_it(tmp_path):
    """`mbr-launch store` serves the store: the agent that would have hosted it is terminated like any other, and
    the two others go on. Then both get SIGTERM at once, as Slurm's preemption or scancel delivers it: that is
    the job's stop (exit 5 on both)."""
    port = free_port()
    store = subprocess.Popen([sys.executable, "-m", "mbr_launch", "store", "--port", str(port), "--host", "127.0.0.1"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=launcher_env(),
                             start_new_session=True)
    job = Job(tmp_path, "mbr-launch", ["--max-restarts=2"], nproc=1, endpoint_port=port)
    try:
        assert store.stdout is not None and "serving" in store.stdout.readline()
        for _ in range(3):
            job.start()
        job.wait_until(lambda: job.counts() == (1, 3, 3), "the first round of 3 agents")
        job.step(Step("kill 0", 1, 2, 2, quiet=True, what="the first agent terminated: the others go on"))
        alive = [a for a in job.agents if a.poll() is None]
        for agent in alive:
            agent.send_signal(signal.SIGTERM)
        codes = [a.wait(WAIT) for a in alive]
        store.send_signal(signal.SIGTERM)
        store_code = store.wait(30)
    finally:
        job.close()
        if store.poll() is None:
            store.kill()
            store.wait()
    assert job.agents[0].returncode == 6
    assert codes == [5, 5], (codes, job.tails())
    assert store_code == 0 and job.world() == 0
    reach = [e for i in (1, 2) for e in run_events(tmp_path / f"logs{i}") if e["event"] == "signal_reach"]
    assert [(e["reach"], e["signalled"]) for e in reach] == [("job", 3), ("job", 3)], reach  # the one that left counts
