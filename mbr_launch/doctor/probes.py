"""Real probes of the machine, each a plain function the context holds as an injectable callable: cheap,
bounded in time, returning data rather than raising where it can.
"""

from __future__ import annotations

import ipaddress
import os
import resource
import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

# GpuInfo and NvmlView are named here too by the doctor's checks and their tests.
from mbr_launch.health.nvml import GpuInfo, GpuMemory, NvmlView  # noqa: F401
from mbr_launch.health import gpuowners
from mbr_launch.health.gpuowners import Job, Reading
from mbr_launch.report.version import installed
from mbr_launch.workers import strays


@dataclass(frozen=True)
class Versions:
    torch: str | None
    nccl: str | None  # None: this torch has no NCCL (CPU build) or torch is missing
    nvrx: str | None
    cuda: str | None
    torch_error: str = ""  # why torch could not be imported, when it could not


@dataclass(frozen=True)
class Limit:
    soft: int | None  # None means unlimited
    hard: int | None


def versions() -> Versions:
    nvrx = installed("nvidia-resiliency-ext")
    try:
        import torch  # noqa: PLC0415 - heavy; only when the check runs
    except Exception as exc:  # a broken torch install raises more than ImportError
        return Versions(torch=None, nccl=None, nvrx=nvrx, cuda=None, torch_error=f"{type(exc).__name__}: {exc}")
    nccl = None
    cuda = torch.version.cuda
    if cuda is not None:
        try:
            raw = torch.cuda.nccl.version()
            nccl = ".".join(str(p) for p in raw)  # (major, minor, patch[, suffix]) in every torch we support
        except Exception:  # CUDA build without NCCL (rare): leave it unknown
            nccl = None
    return Versions(torch=torch.__version__, nccl=nccl, nvrx=nvrx, cuda=cuda)


def gpu_owners(memories: Sequence[GpuMemory], job: Job) -> Reading:
    """Whose each process on the GPUs is, from this machine's /proc (``health.gpuowners``)."""
    return gpuowners.classify(memories, job, strays.process_table(), gpuowners.seen)


def ulimits() -> dict[str, Limit]:
    def lim(kind: int) -> Limit:
        soft, hard = resource.getrlimit(kind)
        inf = resource.RLIM_INFINITY
        return Limit(None if soft == inf else soft, None if hard == inf else hard)

    return {"nofile": lim(resource.RLIMIT_NOFILE), "memlock": lim(resource.RLIMIT_MEMLOCK)}


def shm_bytes(path: str = "/dev/shm") -> int | None:
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_blocks * st.f_frsize


def disk_free(path: str) -> int:
    """Free bytes where ``path`` lives, or would be created: the nearest existing ancestor."""
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free


def script_head(path: str, limit: int = 1 << 20) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(limit).decode("utf-8", errors="replace")
    except OSError:
        return None


def port_free(host: str, port: int) -> bool:
    # As TCPStore binds: the wildcard, SO_REUSEADDR (TIME_WAIT is free; a LISTEN socket anywhere still fails).
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def reachable(host: str, port: int, timeout: float) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def resolve(host: str) -> list[str]:
    try:
        return sorted({ai[4][0] for ai in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)})
    except (OSError, UnicodeError):
        return []


def reverse_lookup_seconds(address: str, cap: float) -> float | None:
    """Seconds a reverse DNS lookup of ``address`` takes, up to ``cap``: None when it had not returned by then
    (it is left to finish in a daemon thread)."""
    import threading  # noqa: PLC0415

    done = threading.Event()

    def lookup() -> None:
        try:
            socket.getnameinfo((address, 0), socket.NI_NUMERICSERV)
        except OSError:
            pass
        done.set()

    started = time.monotonic()
    threading.Thread(target=lookup, name="reverse-dns-probe", daemon=True).start()
    return time.monotonic() - started if done.wait(cap) else None


def local_addresses() -> set[str]:
    """This host's addresses, from /proc/net (cheaper than importing psutil, which every agent would pay before
    its ranks start); through psutil where /proc/net does not say."""
    addrs = {"127.0.0.1", "::1"}
    try:
        with open("/proc/net/fib_trie") as f:
            trie = f.read().splitlines()
        with open("/proc/net/if_inet6") as f:
            inet6 = f.read().splitlines()
    except OSError:
        return addrs | _psutil_addresses()
    address = ""
    for line in trie:
        words = line.split()
        if len(words) == 2 and words[0].endswith("|--"):
            address = words[1]
        elif line.strip() == "/32 host LOCAL" and address:
            addrs.add(address)
    for line in inet6:
        try:
            addrs.add(str(ipaddress.IPv6Address(bytes.fromhex(line.split()[0]))))
        except (IndexError, ValueError):
            continue
    return addrs


def _psutil_addresses() -> set[str]:
    import psutil  # noqa: PLC0415

    return {e.address.split("%")[0] for entries in psutil.net_if_addrs().values() for e in entries
            if e.family in (socket.AF_INET, socket.AF_INET6)}


def rdma_devices() -> list[str]:
    try:
        return sorted(os.listdir("/sys/class/infiniband"))
    except OSError:
        return []
