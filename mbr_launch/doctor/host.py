"""This host: rendezvous endpoint and port, log directory, Flight Recorder directory, /dev/shm, open-file and
memlock limits, disk. The log-dir test is a real write: permission bits lie for root and on read-only mounts.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable

from mbr_launch.doctor.context import DoctorContext
from mbr_launch.doctor.launcher import is_local_host, store_endpoint
from mbr_launch.doctor.registry import Finding, check, check_with, error, info, ok, skip, warn
from mbr_launch.workers import flightrec, safefile

GiB = 1 << 30
MiB = 1 << 20
SHM_ERROR, SHM_WARN = 128 * MiB, 1 * GiB
# Below NOFILE_ERROR workers run out of descriptors; below NOFILE_BASE (+4 per agent on the store's host) a
# DataLoader sharing tensors may. A launch raises its soft limit to NOFILE_WARN where it can (mbr_launch.nofile).
NOFILE_ERROR, NOFILE_BASE, NOFILE_PER_AGENT, NOFILE_WARN = 1024, 16384, 4, 65536
DISK_ERROR, DISK_WARN = 1 * GiB, 10 * GiB


def _store(without: str) -> Callable[[DoctorContext], tuple[str, int] | Finding]:
    """The gate of a check of the store's (host, port): skipped without one (``without`` says why) or a valid one."""

    def gate(ctx: DoctorContext) -> tuple[str, int] | Finding:
        try:
            ep = store_endpoint(ctx)
        except ValueError:
            return skip("endpoint invalid (see rdzv.endpoint)")
        return skip(without) if ep is None else ep

    return gate


@check("rdzv.endpoint", "rendezvous endpoint resolvable and reachable")
def endpoint(ctx: DoctorContext) -> Finding:
    if ctx.standalone:
        return ok("--standalone: a free local port is chosen at start")
    try:
        ep = store_endpoint(ctx)
    except ValueError as exc:
        return error(str(exc), "pass --rdzv-endpoint HOST:PORT, e.g. node001:29400")
    if ep is None:
        if ctx.max_nodes > 1:
            return error(f"--nnodes {ctx.nnodes} but no --rdzv-endpoint (or MASTER_ADDR)",
                         "pass --rdzv-endpoint HOST:PORT of the first node, the same on every node")
        return ok("single node, local rendezvous")
    host, port = ep
    addrs = ctx.resolve(host)
    if not addrs:
        return error(f"rendezvous host {host!r} does not resolve", "use a hostname or IP every node can resolve")
    if is_local_host(ctx, host):
        return ok(f"{host}:{port} is this node: it will host the rendezvous store")
    if ctx.reachable(host, port, ctx.rdzv_timeout_s):
        return ok(f"{host}:{port} ({addrs[0]}) accepts connections")
    return warn(f"{host}:{port} ({addrs[0]}) does not accept connections within {ctx.rdzv_timeout_s:g}s; "
                "fine if that node's launcher has not started yet",
                f"start the launcher on {host} first, or check the address and that the firewall allows TCP {port}")


@check_with(_store("no fixed rendezvous port (standalone or single node)"), "rdzv.port",
            "rendezvous port free on the hosting node")
def port(ep: tuple[str, int], ctx: DoctorContext) -> Finding:
    host, p = ep
    if not is_local_host(ctx, host):
        return skip(f"the store is hosted by {host}, not this node")
    if ctx.port_free(host, p):
        return ok(f"port {p} is free")
    saw = f"port {p} on this node is already in use: the launcher would join whatever listens there"
    fix = f"stop the process on port {p} (`ss -ltnp 'sport = :{p}'`) or choose another port"
    # Several agents of one multi-node job may share a host (tests, dev boxes): the first one's store.
    return warn(saw + " (another node's launcher on this host, perhaps)", fix) if ctx.max_nodes > 1 else error(saw, fix)


REVERSE_DNS_WARN = 0.5  # seconds; torch pays it for every new store connection, the store host once per client
REVERSE_DNS_CAP = 2.0


@check_with(_store("single node: no store connections between nodes"), "rdzv.reverse_dns",
            "reverse DNS of the rendezvous addresses answers quickly", cheap=False)
def reverse_dns(ep: tuple[str, int], ctx: DoctorContext) -> Finding:
    """A slow reverse lookup stalls every new store connection (pytorch#159007; docs/doctor.md)."""
    resolved = ctx.resolve(ep[0])
    # torch connects to an IPv4 address in its mapped form, ::ffff:a.b.c.d: a name /etc/hosts rarely has.
    candidates = [form for a in resolved for form in ((a, f"::ffff:{a}") if ":" not in a else (a,))]
    for address in candidates:
        took = ctx.reverse_lookup(address, REVERSE_DNS_CAP)
        if took is None or took > REVERSE_DNS_WARN:
            saw = (f"a reverse DNS lookup of {address} took {'over ' + format(REVERSE_DNS_CAP, 'g') if took is None else format(took, '.1f')} s: "
                   "torch does one for every new store connection (and a dual-stack store host, as under "
                   "torchrun, for every client it accepts), so each connection waits that long")
            return warn(saw, f"give {address} a name in /etc/hosts on every node, or make the resolver answer "
                             "quickly (a reachable DNS server, nscd)")
    if not candidates:
        return skip(f"{ep[0]} does not resolve (see rdzv.endpoint)")
    return ok(f"{', '.join(candidates)}: answered within {REVERSE_DNS_WARN:g} s")


def write_probe(path: str) -> tuple[bool, str]:
    """Can we write in ``path``, or create it? (ok, what we saw). Uses a real write, not os.access."""
    p = Path(path).absolute()
    probe = p
    while not probe.exists():
        if probe == probe.parent:
            break
        probe = probe.parent
    if not probe.is_dir():
        return False, f"{probe} is not a directory"
    try:
        fd, name = tempfile.mkstemp(prefix=".mbr-doctor-", dir=probe)
        os.close(fd)
        os.unlink(name)
    except OSError as exc:
        return False, f"cannot write in {probe}: {exc.strerror or exc}"
    return True, f"{p} is writable" if probe == p else f"{p} will be created in {probe}"


@check("fs.log_dir", "log directory writable")
def log_dir(ctx: DoctorContext) -> Finding:
    if not ctx.log_dir:
        return skip("no --log-dir given")
    good, saw = write_probe(ctx.log_dir)
    if good:
        return ok(saw)
    return error(saw, "pass a --log-dir on a writable filesystem you own, e.g. --log-dir $HOME/mbr-logs")


@check("fs.flight_recorder", "Flight Recorder files in a directory only you can write")
def flight_recorder(ctx: DoctorContext) -> Finding:
    """Where others can create names, they can plant a FIFO or a symlink where torch writes a rank's dump
    (issue #29); the agent refuses such files when it reads them, this refuses the setting up front."""
    given = [(name, ctx.env[name]) for name in (*flightrec.DUMP_PREFIX, flightrec.PIPE_PREFIX) if ctx.env.get(name)]
    if not given:
        return ok("TORCH_FR_DUMP_TEMP_FILE not set: the dumps go to the run folder (yours alone, mode 0700)")
    for name, prefix in given:
        directory = os.path.dirname(prefix) or "."
        try:
            risk = safefile.planting_risk(directory, uid=ctx.uid)
        except OSError as exc:
            risk = f"{directory} cannot be checked: {exc.strerror or exc}"
        if risk:
            return error(f"{name}={prefix}: {risk}, so another user can put a FIFO or a symlink where torch "
                         "writes and mbr-launch reads this job's Flight Recorder files",
                         f"unset {name} (mbr-launch then keeps the files in the run folder), or point it into "
                         f"a directory only you can write, e.g. `mkdir -m 700 ~/fr && export {name}=~/fr/nccl_trace_`")
    return ok("; ".join(f"{name}={prefix}: only you (and root) can write {os.path.dirname(prefix) or '.'}"
                        for name, prefix in given))


@check("fs.shm", "/dev/shm size (NCCL shared memory, DataLoader workers)")
def shm(ctx: DoctorContext) -> Finding:
    size = ctx.shm_bytes()
    fix = "give the container more shared memory: `docker run --shm-size=16g` (or --ipc=host)"
    if size is None:
        return warn("/dev/shm is missing", fix)
    saw = f"/dev/shm is {size / MiB:.0f} MiB"
    if size < SHM_ERROR:
        return error(saw + ": NCCL fails to allocate its shared-memory buffers and DataLoader workers die with "
                     "bus errors", fix)
    if size < SHM_WARN:
        return warn(saw + ": tight for NCCL plus DataLoader workers", fix)
    return ok(saw)


def _fmt(v: int | None) -> str:
    return "unlimited" if v is None else str(v)


@check("limits.nofile", "open files limit (ulimit -n)")
def nofile(ctx: DoctorContext) -> Finding:
    lim = ctx.ulimits()["nofile"]
    soft = lim.soft if lim.soft is not None else 1 << 62
    saw = f"ulimit -n soft={_fmt(lim.soft)} hard={_fmt(lim.hard)}"
    target = NOFILE_WARN if lim.hard is None else min(NOFILE_WARN, lim.hard)
    fix = (f"raise it before launching: `ulimit -n {target}`" if target > soft else
           f"raise the hard limit (e.g. `nofile {NOFILE_WARN}` in /etc/security/limits.conf, or "
           f"`docker run --ulimit nofile={NOFILE_WARN}`)")
    if soft < NOFILE_ERROR:
        return error(saw + ": workers run out of file descriptors (sockets, shared-memory tensors)", fix)
    try:
        need = NOFILE_BASE + NOFILE_PER_AGENT * ctx.max_nodes
    except ValueError:  # a bad --nnodes is another check's to report
        need = NOFILE_BASE
    if soft < need:
        return warn(saw + f": below {need} (DataLoader workers sharing tensors may hit 'Too many open files'; the "
                    "store's host needs about 4 per agent); a launch raises the soft limit to the hard one, and "
                    "that is not enough here", fix)
    return ok(saw)


@check("limits.memlock", "locked memory limit (ulimit -l) for RDMA")
def memlock(ctx: DoctorContext) -> Finding:
    lim = ctx.ulimits()["memlock"]
    saw = f"ulimit -l soft={_fmt(lim.soft)}"
    if lim.soft is None:
        return ok(saw)
    if ctx.max_nodes <= 1:
        return ok(saw + " (single node: NCCL does not register RDMA memory)")
    devices = ctx.rdma_devices()
    fix = "set `ulimit -l unlimited` (limits.conf `memlock unlimited`, or `docker run --ulimit memlock=-1`)"
    if devices:
        return error(saw + f" on a multi-node job with RDMA devices {', '.join(devices)}: NCCL cannot register "
                     "memory and falls back to sockets or fails", fix)
    return info(saw + " (no RDMA devices found: NCCL will use TCP sockets)", fix)


@check("fs.disk", "free disk space where asked")
def disk(ctx: DoctorContext) -> Finding:
    if not ctx.disk_paths:
        return skip("no paths given")
    worst: list[Finding] = []
    parts = []
    for path in ctx.disk_paths:
        try:
            free = ctx.disk_free(path)
        except OSError as exc:
            worst.append(error(f"{path}: {exc.strerror or exc}", "check the path"))
            continue
        parts.append(f"{path}: {free / GiB:.1f} GiB free")
        if free < DISK_ERROR:
            worst.append(error(f"{path}: only {free / MiB:.0f} MiB free", f"free space on {path} or point it elsewhere"))
        elif free < DISK_WARN:
            worst.append(warn(f"{path}: {free / GiB:.1f} GiB free; checkpoints may not fit",
                              f"free space on {path} (at least {DISK_WARN // GiB} GiB)"))
    for sev in ("error", "warn"):
        hits = [f for f in worst if f.severity == sev]
        if hits:
            return Finding(sev, "; ".join(f.saw for f in hits), hits[0].fix)
    return ok("; ".join(parts))
