"""What ``build_config`` asks of the machine it runs on, as one injectable value.

``HostProbes()`` asks the real host (device counts, whether a host is this one, who holds a port); tests
pass fakes, so building a config needs no sockets, DNS or torch."""

from __future__ import annotations

import ast
import os
import re
import shutil
import socket
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

from mbr_launch.config.nvrx import NvrxFound
from mbr_launch.report.version import metadata_folder


def device_count(kind: str) -> int:
    if kind == "cpu":
        return os.cpu_count() or 1
    import torch  # late: only these spellings need it, and it costs seconds of start-up

    if kind == "gpu":
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    if kind == "xpu":
        return torch.xpu.device_count() if hasattr(torch, "xpu") and torch.xpu.is_available() else 0
    if torch.cuda.is_available():
        return torch.cuda.device_count()
    return os.cpu_count() or 1


def port_taken(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host if host not in ("localhost",) else "127.0.0.1", port))
        except OSError:
            return True
    return False


def is_local_host(host: str) -> bool:
    if host in ("localhost", "127.0.0.1", "::1", "") or host in (socket.gethostname(), socket.getfqdn()):
        return True  # the common names first: getfqdn is a lookup
    try:
        return socket.gethostbyname(host).startswith("127.")
    except OSError:
        return False


def listener_is_launcher(port: int) -> bool:
    try:
        import psutil  # late: only a taken port needs it

        for conn in psutil.net_connections(kind="tcp"):
            if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN and conn.pid:
                cmd = " ".join(psutil.Process(conn.pid).cmdline())
                return "mbr_launch" in cmd or "mbr-launch" in cmd
    except Exception:
        return True  # cannot tell: do not refuse a possibly legitimate peer
    return False


def log_dir_problem(path: str) -> str | None:
    """Why the launcher could not make its run folders under ``--log-dir path``, or None. A probe made before
    anything starts: one private folder created and removed in the deepest existing part of ``path`` also
    catches what permission bits cannot show (a read-only mount, a full inode table)."""
    target = Path(path).absolute()
    existing = target
    while not exists(str(existing)) and existing != existing.parent:
        if _asks(Path.is_symlink)(str(existing)):
            return f"{existing} is a symbolic link to nowhere"
        existing = existing.parent
    if not is_dir(str(existing)):
        if existing == target:
            return f"{path} exists and is not a directory"
        return f"{existing} is a file, so {path} cannot be a directory under it"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".mbr-launch-probe-", dir=existing))
        name_max = os.pathconf(existing, "PC_NAME_MAX")
    except OSError as err:
        return f"cannot create folders in {existing}: {err.strerror or err}"
    for part in target.relative_to(existing).parts:
        if len(os.fsencode(part)) > name_max:
            return f"the folder name {part[:16]}... is longer than this file system's {name_max} bytes"
    # the agent adds <run id>_<6 hex>_<host>/attempt_N/<rank>/stdout.log below it
    if len(os.fsencode(str(target))) > 3000:
        return "the path is too long (over 3000 bytes) to hold the run folders"
    return None


def _asks(test: Callable[[Path], bool]) -> Callable[[str], bool]:
    """``test`` on a path, False where pathlib raises (a name too long, a loop, EACCES): a question about the
    user's input must not crash the launch."""

    def ask(path: str) -> bool:
        try:
            return test(Path(path))
        except (OSError, ValueError):  # ValueError: a NUL byte in the path
            return False

    return ask


is_file, is_dir, exists = _asks(Path.is_file), _asks(Path.is_dir), _asks(Path.exists)


def program_exists(program: str) -> bool:
    try:
        return shutil.which(program) is not None or is_file(program)
    except (OSError, ValueError):
        return False


def workers_nvrx(environ: Mapping[str, str]) -> NvrxFound:
    """The NVRx a worker started with ``environ`` would import, found without importing it: the first metadata
    folder on ``environ``'s PYTHONPATH, then on this launcher's ``sys.path`` (the workers' interpreter)."""
    entries = [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    for paths, via in ((entries, "PYTHONPATH"), (sys.path, "the launcher's sys.path")):
        found = metadata_folder("nvidia-resiliency-ext", paths)
        if found is not None:
            return NvrxFound(version=found[0], where=found[1], via=via)
    return NvrxFound(version=None)


_RELEASE = re.compile(r"(\d{1,6})(?:\.(\d{1,6}))?(?:\.(\d{1,6}))?")
NEWEST = (9999,)  # a torch whose version cannot be read: taken to have every option and key


def release(text: str) -> tuple[int, ...]:
    found = _RELEASE.match(text)
    return tuple(int(part) for part in found.groups() if part is not None) if found else NEWEST


def torch_version() -> tuple[int, ...]:
    """The installed torch's release, from its metadata: importing torch would cost seconds."""
    from importlib import metadata

    try:
        return release(metadata.version("torch"))
    except (metadata.PackageNotFoundError, ValueError):
        return NEWEST


# Standard-library ways of importing a module by a name computed at run time.
_DYNAMIC_MODULES = frozenset({"importlib", "runpy", "imp", "pkgutil", "zipimport"})
_DYNAMIC_CALLS = frozenset({"__import__", "exec", "eval", "compile"})
_MAX_BYTES = 4 * 1024 * 1024  # a larger entry script is not read (it keeps the asked-for level)


def imports_only_stdlib(script: str | None) -> bool:
    """True when ``script`` (a file path, never a ``-m`` module) provably imports only the standard library, so its
    standbys need not preload torch (docs/performance.md). Conservative: anything that can import a module this
    scan cannot see (a relative import, ``importlib``, ``__import__``, ``exec``, a source that does not parse)
    counts as "may need torch"."""
    if not script:
        return False
    path = Path(script)
    try:
        if not path.is_file() or path.stat().st_size > _MAX_BYTES:
            return False
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (OSError, SyntaxError, ValueError, RecursionError):
        return False
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots = [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: the script belongs to a package of its own
                return False
            roots = [(node.module or "").split(".")[0]]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _DYNAMIC_CALLS:
            return False
        else:
            continue
        if any(root not in stdlib or root in _DYNAMIC_MODULES for root in roots):
            return False
    return True


@dataclass(frozen=True)
class HostProbes:
    device_count: Callable[[str], int] = device_count
    is_local_host: Callable[[str], bool] = is_local_host
    port_taken: Callable[[str, int], bool] = port_taken
    listener_is_launcher: Callable[[int], bool] = listener_is_launcher
    is_file: Callable[[str], bool] = is_file
    is_dir: Callable[[str], bool] = is_dir
    exists: Callable[[str], bool] = exists
    log_dir_problem: Callable[[str], str | None] = log_dir_problem
    program_exists: Callable[[str], bool] = program_exists
    stdlib_only_script: Callable[[str], bool] = imports_only_stdlib
    workers_nvrx: Callable[[Mapping[str, str]], NvrxFound] = workers_nvrx  # where versions of NVRx disagree
    torch_version: Callable[[], tuple[int, ...]] = torch_version  # where torch releases read options differently
