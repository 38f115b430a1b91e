"""Bring up and tear down the single-machine Slurm cluster the Slurm tests run on (root only).

Layout: slurmctld on the host, reached at ``<subnet>.1`` on a private bridge ``mbr-br0``; one slurmd per
"node" ``n<i>``, each in its own network and UTS namespace ``mbr-n<i>`` (hostname ``n<i>``, address
``<subnet>.<i+1>`` on ``eth0``, the host side of its veth is ``mbr-v<i>``). The bridge is linked to nothing
and the namespaces have no default route, so nothing leaves the machine, and a node can be cut off by taking
its veth down or by a firewall inside its namespace. Everything is on one filesystem, so the repository's
venv works inside job steps.

Idempotent: ``start`` writes the configuration, starts only what is not running, heals links and firewall
rules a test may have left, and waits until every node is idle. ``stop`` cancels jobs, stops the daemons and
removes the network. Packages come from ``.ci/slurm-setup.sh`` (``scripts/test`` runs it as root).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

CONF_DIR = Path("/etc/slurm")
CTLD_STATE = Path("/var/lib/slurm/slurmctld")
SPOOL = Path("/var/lib/slurm/slurmd")
LOGS = Path("/var/log/slurm")
CTLD_PID = Path("/run/slurmctld.pid")
MUNGE_KEY = Path("/etc/munge/munge.key")
MUNGE_PID = Path("/run/munge/munged.pid")
HOSTS = Path("/etc/hosts")
HOSTS_BEGIN, HOSTS_END = "# BEGIN mbr-slurm", "# END mbr-slurm"
BRIDGE = "mbr-br0"
NEEDED = ("slurmctld", "slurmd", "scontrol", "sinfo", "munged", "munge", "unmunge", "nsenter", "unshare", "ip",
          "nft")


class TestbedError(RuntimeError):
    """The cluster could not be brought up or down; the message has the command and its output."""


@dataclass(frozen=True)
class Layout:
    nodes: int = 2
    cpus_per_node: int = 4
    subnet: str = "10.200.0"  # a /24 nobody else routes on this machine

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f"n{i}" for i in range(1, self.nodes + 1))

    def ip(self, node: str) -> str:
        return f"{self.subnet}.{self.names.index(node) + 2}"

    @property
    def controller_ip(self) -> str:
        return f"{self.subnet}.1"


def missing_tools() -> list[str]:
    return [t for t in NEEDED if shutil.which(t) is None]


def slurm_conf(layout: Layout, host: str) -> str:
    """The cluster's slurm.conf. Short timeouts where tests wait on them (credential expiry, kill wait);
    ``ReturnToService=2`` so a node that was cut off comes back by itself once it answers again."""
    lines = [
        "# written by testkit/slurm_testbed.py: the mbr-launch single-machine test cluster",
        "ClusterName=mbrtest",
        f"SlurmctldHost={host}({layout.controller_ip})",
        "SlurmctldPort=6817", "SlurmdPort=6818",
        "AuthType=auth/munge", "AuthInfo=cred_expire=10", "CredType=cred/munge",
        "SlurmUser=slurm", "SlurmdUser=root",
        f"StateSaveLocation={CTLD_STATE}", f"SlurmdSpoolDir={SPOOL}/%n",
        f"SlurmctldPidFile={CTLD_PID}", "SlurmdPidFile=/run/slurmd-%n.pid",
        f"SlurmctldLogFile={LOGS}/slurmctld.log", f"SlurmdLogFile={LOGS}/slurmd-%n.log",
        "SlurmctldDebug=info", "SlurmdDebug=info",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
        # no accounting daemon: finished jobs are read from this file (SlurmCluster.finished_jobs)
        "JobCompType=jobcomp/filetxt", f"JobCompLoc={LOGS}/jobcomp.log",
        "MpiDefault=none", "SwitchType=switch/none",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
        "SchedulerType=sched/backfill", "SchedulerParameters=sched_interval=5,bf_interval=5",
        "SlurmdParameters=config_overrides",  # the node's real CPU count may differ from CPUs= below
        "ReturnToService=2", "SlurmdTimeout=60", "KillWait=10", "MinJobAge=300", "InactiveLimit=0",
        "Waittime=0", "JobRequeue=1",
    ]
    lines += [f"NodeName={n} NodeHostname={n} NodeAddr={layout.ip(n)} CPUs={layout.cpus_per_node} "
              f"RealMemory=2000 State=UNKNOWN" for n in layout.names]
    lines.append("PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


CGROUP_CONF = "CgroupPlugin=autodetect\nIgnoreSystemdOnFailure=yes\n"


# ---- small process helpers ----------------------------------------------------------------------------

def _run(argv: Sequence[str], *, check: bool = True, timeout: float = 30, **kw: Any,
         ) -> subprocess.CompletedProcess[str]:
    kw.setdefault("env", _daemon_env())
    r = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, **kw)
    if check and r.returncode != 0:
        raise TestbedError(f"{' '.join(argv)} exited {r.returncode}: {(r.stderr or r.stdout).strip()[-2000:]}")
    return r


def _daemon_env() -> dict[str, str]:
    # Daemons outlive every test: keep them out of the conftest leftover check's marker.
    return {k: v for k, v in os.environ.items() if k != "MBR_TEST_SESSION"}


def _alive(pidfile: Path, comm: str) -> int | None:
    """The pid in ``pidfile`` when that process is running and is ``comm`` (pid files outlive daemons)."""
    try:
        pid = int(pidfile.read_text().strip())
        if Path(f"/proc/{pid}/comm").read_text().strip() == comm:
            return pid
    except (OSError, ValueError):
        pass
    return None


def _stop_daemons(comm: str, pidfiles: Sequence[Path], grace: float = 10.0) -> None:
    """SIGTERM every live daemon of these pid files at once, SIGKILL what is left after ``grace``."""
    pids = [p for p in (_alive(f, comm) for f in pidfiles) if p is not None]
    for pid in pids:
        _signal(pid, 15)
    deadline = time.monotonic() + grace
    while pids and time.monotonic() < deadline:
        pids = [p for p in pids if Path(f"/proc/{p}").exists()]
        time.sleep(0.1)
    for pid in pids:
        _signal(pid, 9)
    for f in pidfiles:
        f.unlink(missing_ok=True)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _wait(what: str, ready: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise TestbedError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.1)


def _slurmd_pidfiles() -> list[Path]:
    return sorted(Path("/run").glob("slurmd-*.pid"))


# ---- pieces of start ----------------------------------------------------------------------------------

def _install_text(path: Path, text: str) -> bool:
    """Write ``path`` when its text differs; True when it changed."""
    if path.exists() and path.read_text() == text:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(text)
    tmp.chmod(0o644)
    tmp.replace(path)
    return True


def _hosts_block(entries: Sequence[tuple[str, str]]) -> None:
    """Replace our block in /etc/hosts, writing in place (it may be a bind mount, so no rename)."""
    kept, inside = [], False
    for line in HOSTS.read_text().splitlines():
        if line == HOSTS_BEGIN:
            inside = True
        elif line == HOSTS_END:
            inside = False
        elif not inside:
            kept.append(line)
    if entries:
        kept += [HOSTS_BEGIN, *(f"{ip} {name}" for ip, name in entries), HOSTS_END]
    with open(HOSTS, "w") as f:
        f.write("\n".join(kept) + "\n")


def _link_exists(name: str) -> bool:
    return _run(["ip", "link", "show", "dev", name], check=False).returncode == 0


def _network(layout: Layout) -> None:
    if not _link_exists(BRIDGE):
        routes = _run(["ip", "-4", "route", "show"]).stdout
        if f"{layout.subnet}.0/24 " in routes:
            raise TestbedError(f"{layout.subnet}.0/24 is already routed on this machine: pick another subnet")
        _run(["ip", "link", "add", BRIDGE, "type", "bridge"])
    _run(["ip", "addr", "replace", f"{layout.controller_ip}/24", "dev", BRIDGE])
    _run(["ip", "link", "set", BRIDGE, "up"])
    for i, node in enumerate(layout.names, start=1):
        ns, veth = f"mbr-{node}", f"mbr-v{i}"
        if not Path(f"/run/netns/{ns}").exists():
            _run(["ip", "netns", "add", ns])
        if not _link_exists(veth):
            _run(["ip", "-n", ns, "link", "del", "eth0"], check=False)
            _run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns])
        _run(["ip", "link", "set", veth, "master", BRIDGE, "up"])  # "up" also heals a cut link
        _run(["ip", "-n", ns, "addr", "replace", f"{layout.ip(node)}/24", "dev", "eth0"])
        _run(["ip", "-n", ns, "link", "set", "lo", "up"])
        _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
        _run(["nsenter", f"--net=/run/netns/{ns}", "nft", "flush", "ruleset"], check=False)  # a cut by firewall
    _hosts_block([(layout.controller_ip, "mbr-ctl"), *((layout.ip(n), n) for n in layout.names)])


def _munge_works() -> bool:
    cred = _run(["munge", "-n"], check=False, stdin=subprocess.DEVNULL)
    return cred.returncode == 0 and _run(["unmunge"], check=False, input=cred.stdout).returncode == 0


def _munge() -> None:
    if not MUNGE_KEY.exists() or MUNGE_KEY.stat().st_size == 0:
        MUNGE_KEY.parent.mkdir(parents=True, exist_ok=True)
        MUNGE_KEY.write_bytes(os.urandom(1024))
    shutil.chown(MUNGE_KEY, "munge", "munge")
    MUNGE_KEY.chmod(0o400)
    if _munge_works():
        return
    _stop_daemons("munged", [MUNGE_PID])
    MUNGE_PID.parent.mkdir(parents=True, exist_ok=True)
    shutil.chown(MUNGE_PID.parent, "munge", "munge")
    _run(["runuser", "-u", "munge", "--", "munged"])
    _wait("munged", _munge_works, 10)


def _controller(fresh_state: bool) -> None:
    for d in (CTLD_STATE, LOGS):
        d.mkdir(parents=True, exist_ok=True)
        shutil.chown(d, "slurm", "slurm")
    if _alive(CTLD_PID, "slurmctld"):
        return
    CTLD_PID.unlink(missing_ok=True)
    if fresh_state:  # jobs of an earlier session must not come back
        for entry in CTLD_STATE.iterdir():
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    _run(["slurmctld"])

    def up() -> bool:
        return "is UP" in _run(["scontrol", "ping"], check=False).stdout
    try:
        _wait("slurmctld to answer", up, 15)
    except TestbedError:
        log = (LOGS / "slurmctld.log")
        tail = log.read_text().splitlines()[-20:] if log.exists() else []
        raise TestbedError("slurmctld did not come up:\n" + "\n".join(tail)) from None


def _node_daemons(layout: Layout) -> None:
    for node in layout.names:
        pidfile = Path(f"/run/slurmd-{node}.pid")
        if _alive(pidfile, "slurmd"):
            continue
        pidfile.unlink(missing_ok=True)
        (SPOOL / node).mkdir(parents=True, exist_ok=True)
        # nsenter rather than `ip netns exec`, which remounts /sys: slurmd then cannot see the cgroup tree.
        _run(["nsenter", f"--net=/run/netns/mbr-{node}", "unshare", "--uts", "sh", "-c",
              f"hostname {node} && exec slurmd -N {node}"])


def _node_states() -> dict[str, str]:
    out = _run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False).stdout.split()
    return dict(zip(out[0::2], out[1::2]))


def _all_idle(layout: Layout) -> bool:
    states = _node_states()
    for node, state in states.items():  # left down or drained by an earlier run
        if state.startswith(("down", "drain", "drng", "fail")):
            _run(["scontrol", "update", f"nodename={node}", "state=resume"], check=False)
    return all(states.get(n) == "idle" for n in layout.names)


# ---- the two entry points -----------------------------------------------------------------------------

def start(layout: Layout = Layout(), *, timeout: float = 90) -> None:
    if os.geteuid() != 0:
        raise TestbedError("the Slurm test cluster needs root")
    missing = missing_tools()
    if missing:
        raise TestbedError(f"missing {', '.join(missing)}: run `bash .ci/slurm-setup.sh` as root")
    if Path("/run/systemd/system").is_dir():  # packaged units would compete with our daemons
        _run(["systemctl", "disable", "--now", "slurmd", "slurmctld"], check=False)
    changed = _install_text(CONF_DIR / "slurm.conf", slurm_conf(layout, socket.gethostname().split(".")[0]))
    changed |= _install_text(CONF_DIR / "cgroup.conf", CGROUP_CONF)
    if changed:  # running daemons read the old configuration
        _stop_daemons("slurmd", _slurmd_pidfiles())
        _stop_daemons("slurmctld", [CTLD_PID])
    _network(layout)
    _munge()
    _controller(fresh_state=True)
    _node_daemons(layout)
    _wait("every node idle in sinfo", lambda: _all_idle(layout), timeout)


def stop(layout: Layout = Layout(), *, keep_munge: bool = False) -> None:
    """Cancel every job (while the daemons can still clean up), stop the daemons, remove the network."""
    if _alive(CTLD_PID, "slurmctld") and "is UP" in _run(["scontrol", "ping"], check=False).stdout:
        jobs = _run(["squeue", "-h", "-o", "%i"], check=False).stdout.split()
        if jobs:
            _run(["scancel", "--full", *jobs], check=False)
            deadline = time.monotonic() + 30
            while _run(["squeue", "-h", "-o", "%i"], check=False).stdout.strip() and time.monotonic() < deadline:
                time.sleep(0.2)
    _stop_daemons("slurmd", _slurmd_pidfiles())
    _stop_daemons("slurmctld", [CTLD_PID])
    for nsfile in sorted(Path("/run/netns").glob("mbr-n*")):
        pids = _run(["ip", "netns", "pids", nsfile.name], check=False).stdout.split()
        for pid in pids:  # job steps a test left inside the node
            _signal(int(pid), 9)
        _run(["ip", "netns", "del", nsfile.name], check=False)
    for i in range(1, layout.nodes + 1):
        if _link_exists(f"mbr-v{i}"):
            _run(["ip", "link", "del", f"mbr-v{i}"], check=False)
    if _link_exists(BRIDGE):
        _run(["ip", "link", "del", BRIDGE], check=False)
    _hosts_block([])
    if not keep_munge:
        _stop_daemons("munged", [MUNGE_PID])


def scratch_conf(folder: Path) -> Path:
    """A minimal slurm.conf in ``folder``, for the Slurm commands that read one but need no cluster
    (``scontrol show hostnames``): pass it as ``SLURM_CONF``."""
    path = folder / "slurm.conf"
    path.write_text("ClusterName=scratch\nSlurmctldHost=localhost\nNodeName=n1 CPUs=1\nPartitionName=p Nodes=ALL\n")
    return path
