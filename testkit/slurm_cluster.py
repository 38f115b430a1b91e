"""A real single-machine Slurm cluster for tests: the ``slurm_cluster`` session fixture.

``testkit/slurm_testbed.py`` runs slurmctld plus one slurmd per "node" n<i>, each in its own network
namespace mbr-n<i> with IP <subnet>.<i+1> on a private bridge. Job steps run inside their
node's namespace, on the same filesystem, so the repo's venv works in them and a step on n1 reaches a
port opened by a step on n2 at n2's IP (or name: /etc/hosts lists the nodes).

Use it from any test module::

    from testkit.slurm_cluster import slurm_cluster  # noqa: F401  (registers the fixture)

    @pytest.mark.slurm
    def test_x(slurm_cluster): slurm_cluster.srun(["-N2", "hostname"], timeout=30)

The cluster is started once per session and stopped at its end (set MBR_SLURM_KEEP=1 to leave it up
for the next run). Tests that leave jobs or cut nodes should call ``reset()`` or use ``slurm_clean``.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from testkit import slurm_testbed

REPO = Path(__file__).resolve().parents[1]

LAYOUT = slurm_testbed.Layout(nodes=2)
# How long a job may sit in COMPLETING, with nothing else pending, before settle() forces its nodes.
COMPLETING_GRACE = 15.0


class ClusterError(RuntimeError):
    """A cluster command failed or timed out; the message has the command and its output."""


def _tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class SlurmCluster:
    nodes: tuple[str, ...]
    ips: dict[str, str]
    start_seconds: float
    _cut: dict[str, str] = field(default_factory=dict)  # node -> how it was cut

    # ---- commands --------------------------------------------------------------------------------

    def run(self, cmd: Sequence[str] | str, timeout: float, *, check: bool = True,
            env: Mapping[str, str] | None = None, cwd: str | Path | None = None,
            ) -> subprocess.CompletedProcess[str]:
        """Run a command on the host (a string goes through bash). On timeout the whole process group
        gets SIGTERM (srun passes it on and ends its step), then SIGKILL 5 s later."""
        argv = ["bash", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=None if env is None else dict(env), cwd=cwd, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for sig, grace in ((15, 5.0), (9, 5.0)):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    out, err = proc.communicate(timeout=grace)
                    break
                except subprocess.TimeoutExpired:
                    continue
            else:
                out, err = "", ""
            raise ClusterError(f"timed out after {timeout}s: {shlex.join(argv)}\n{_tail(out)}\n{_tail(err)}")
        result = subprocess.CompletedProcess(argv, proc.returncode, out, err)
        if check and proc.returncode != 0:
            raise ClusterError(f"exit {proc.returncode}: {shlex.join(argv)}\n{_tail(out)}\n{_tail(err)}")
        return result

    def srun(self, args: Sequence[str], timeout: float, *, check: bool = True,
             env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """``srun <args>``; the step runs in /tmp unless args say otherwise (any node can cd there)."""
        named = any(a.startswith(("-J", "--job-name")) for a in args)
        name = [] if named else [f"--job-name=mbrtest-{uuid.uuid4().hex[:8]}"]
        return self.run(["srun", *name, *args], timeout, check=check, env=env, cwd="/tmp")

    def sbatch(self, script: str, args: Sequence[str] = (), *, timeout: float, wait: bool = True,
               env: Mapping[str, str] | None = None) -> tuple[str, subprocess.CompletedProcess[str]]:
        """Submit ``script`` (the text of a batch script); returns (job id, result). With ``wait`` the
        result's returncode is the job's exit code (``sbatch --wait``): check it yourself."""
        name = f"mbrtest-{uuid.uuid4().hex[:8]}"  # lets a timeout cancel the job it cannot name yet
        argv = ["sbatch", "--parsable", "--chdir=/tmp", f"--job-name={name}", *args, *(["--wait"] if wait else [])]
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=None if env is None else dict(env), cwd="/tmp",
                                start_new_session=True)
        try:
            out, err = proc.communicate(script, timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.communicate()
            self.run(["scancel", "--full", f"--name={name}"], 10, check=False)
            raise ClusterError(f"timed out after {timeout}s: {shlex.join(argv)}") from None
        job_id = out.split(";")[0].split()[0] if out.strip() else ""
        if not job_id.isdigit():
            raise ClusterError(f"sbatch gave no job id: {shlex.join(argv)}\n{out}\n{err}")
        return job_id, subprocess.CompletedProcess(argv, proc.returncode, out, err)

    def squeue(self) -> list[dict[str, str]]:
        """Jobs slurmctld lists: pending, running and completing (finished ones drop out)."""
        out = self.run(["squeue", "-h", "-o", "%i|%j|%T|%N|%R"], 10).stdout
        keys = ("id", "name", "state", "nodes", "reason")
        return [dict(zip(keys, line.split("|"))) for line in out.splitlines() if line.strip()]

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job`` as a dict (JobState, Restarts, ExitCode, BatchHost, ...)."""
        out = self.run(["scontrol", "-o", "show", "job", job_id], 10).stdout
        fields: dict[str, str] = {}
        for tok in out.split():
            key, sep, value = tok.partition("=")
            if sep:
                fields[key] = value
        return fields

    def finished_jobs(self) -> list[dict[str, str]]:
        """Records of completed jobs. There is no accounting (sacct says "disabled"), but
        jobcomp/filetxt writes one line per finished job."""
        path = Path("/var/log/slurm/jobcomp.log")
        if not path.exists():
            return []
        return [dict(t.split("=", 1) for t in line.split() if "=" in t) for line in path.read_text().splitlines()]

    # ---- inside a node ---------------------------------------------------------------------------

    def ns_cmd(self, node: str, cmd: Sequence[str]) -> list[str]:
        """argv that runs ``cmd`` in ``node``'s network namespace (nsenter, not `ip netns exec`,
        which remounts /sys)."""
        return ["nsenter", f"--net=/run/netns/mbr-{node}", *cmd]

    def cut(self, node: str, how: str = "link") -> None:
        """Partition ``node`` from everything else, slurmctld included: ``link`` takes its veth down,
        ``nft`` drops every packet in its namespace except loopback. Either way peers see silence, not
        refusals: a new connection times out, no RST comes back. Heal within SlurmdTimeout (60 s) or
        slurmctld marks the node down (``reset()`` resumes it)."""
        self._check_node(node)
        i = self.nodes.index(node) + 1
        if how == "link":
            self.run(["ip", "link", "set", f"mbr-v{i}", "down"], 10)
        elif how == "nft":
            rules = ("table inet mbrcut {\n"
                     " chain in { type filter hook input priority 0; policy drop; iif lo accept; }\n"
                     " chain out { type filter hook output priority 0; policy drop; oif lo accept; }\n}\n")
            self._nft(node, rules)
        else:
            raise ValueError(f"cut(how={how!r}): expected 'link' or 'nft'")
        self._cut[node] = how

    def heal(self, node: str) -> None:
        self._check_node(node)
        i = self.nodes.index(node) + 1
        self.run(["ip", "link", "set", f"mbr-v{i}", "up"], 10)
        self.run(self.ns_cmd(node, ["nft", "flush", "ruleset"]), 10)
        self._cut.pop(node, None)

    def _nft(self, node: str, rules: str) -> None:
        r = subprocess.run(self.ns_cmd(node, ["nft", "-f", "-"]), input=rules, text=True,
                           capture_output=True, timeout=10)
        if r.returncode != 0:
            raise ClusterError(f"nft in {node} failed: {r.stderr.strip()}")

    def _check_node(self, node: str) -> None:
        if node not in self.nodes:
            raise ValueError(f"unknown node {node!r}; the cluster has {list(self.nodes)}")

    # ---- housekeeping ----------------------------------------------------------------------------

    def wait_for(self, what: str, pred: Callable[[], bool], timeout: float, every: float = 0.2) -> None:
        deadline = time.monotonic() + timeout
        while not pred():
            if time.monotonic() > deadline:
                raise ClusterError(f"timed out after {timeout}s waiting for {what}")
            time.sleep(every)

    def idle(self) -> bool:
        out = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], 10).stdout.split()
        states = dict(zip(out[0::2], out[1::2]))
        return all(states.get(n) == "idle" for n in self.nodes)

    def settle(self, name: str | None = None, timeout: float = 60) -> list[str]:
        """Wait until the job called ``name`` (every job when None) has left squeue; return the nodes it had
        to force. A job that ran on a node while that node was cut can sit in COMPLETING long after its
        processes are gone: slurmctld's terminate request to the node failed during the cut, and it only
        retries failed requests about a minute apart (more than SlurmdTimeout/3 pings take to notice the
        healed node). After COMPLETING_GRACE seconds the nodes it still waits on are set down and resumed, as
        an admin clears a stuck CG job, so the next test gets idle nodes. Every process still alive is
        checked by the leftover-process fixture, not here: forcing Slurm does not hide a launcher left running."""
        def mine() -> list[dict[str, str]]:
            return [j for j in self.squeue() if name is None or j["name"] == name]

        deadline, forced = time.monotonic() + timeout, []
        stuck_since: float | None = None
        while jobs := mine():
            now = time.monotonic()
            if now > deadline:
                raise ClusterError(f"timed out after {timeout}s waiting for jobs to leave squeue: {jobs}")
            completing = [j for j in jobs if j["state"] == "COMPLETING"]
            stuck_since = (stuck_since or now) if completing and len(completing) == len(jobs) else None
            if stuck_since is not None and now - stuck_since > COMPLETING_GRACE:
                nodes = sorted({n for j in completing for n in self.expand(j["nodes"])} - set(forced))
                for node in nodes:
                    self.run(["scontrol", "update", f"nodename={node}", "state=down",
                              "reason=mbrtest: job stuck completing after a cut"], 10, check=False)
                    self.run(["scontrol", "update", f"nodename={node}", "state=resume"], 10, check=False)
                forced += nodes
                stuck_since = None
            time.sleep(0.5)
        return forced

    def expand(self, nodelist: str) -> list[str]:
        """A Slurm node list ("n[1-2]", "n2") as names."""
        if not nodelist.strip():
            return []
        return self.run(["scontrol", "show", "hostnames", nodelist], 10).stdout.split()

    def reset(self, timeout: float = 90) -> None:
        """Heal every node, cancel every job and wait until all nodes are idle again."""
        for node in list(self._cut):
            self.heal(node)
        if self.squeue():
            self.run(["scancel", "--full", "--user=root"], 10, check=False)
            self.settle(timeout=timeout)
        for node in self.nodes:  # a node that missed its slurmctld deadline while cut comes back down
            self.run(["scontrol", "update", f"nodename={node}", "state=resume"], 10, check=False)
        self.wait_for("nodes idle", self.idle, timeout)


def _start() -> SlurmCluster:
    t0 = time.monotonic()
    try:
        slurm_testbed.start(LAYOUT)
    except (slurm_testbed.TestbedError, subprocess.TimeoutExpired, OSError) as exc:
        raise ClusterError(f"the Slurm test cluster did not come up: {exc}") from None
    return SlurmCluster(nodes=LAYOUT.names, ips={n: LAYOUT.ip(n) for n in LAYOUT.names},
                        start_seconds=time.monotonic() - t0)


def _stop() -> None:
    slurm_testbed.stop(LAYOUT)


# One cluster per process even when several modules import the fixture (each import is its own
# FixtureDef): start on first use, stop when the last user finishes.
_cluster: SlurmCluster | None = None
_users = 0


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    global _cluster, _users
    if os.geteuid() != 0:
        pytest.skip("the Slurm test cluster needs root")
    missing = slurm_testbed.missing_tools()
    if missing:
        pytest.skip(f"Slurm is not installed ({', '.join(missing)} missing): run `bash .ci/slurm-setup.sh` as root")
    if _cluster is None:
        _cluster = _start()
    _users += 1
    try:
        yield _cluster
    finally:
        _users -= 1
        if _users == 0:
            _cluster = None
            if os.environ.get("MBR_SLURM_KEEP") != "1":
                _stop()


@pytest.fixture
def slurm_clean(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """The session cluster, reset (jobs cancelled, nodes healed and idle) after the test."""
    try:
        yield slurm_cluster
    finally:
        slurm_cluster.reset()
