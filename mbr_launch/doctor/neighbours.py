"""Which other launcher processes on this host get in this job's way (``launcher.per_node``): this user's real
launches (not ``--help`` or ``doctor``) on the same rendezvous endpoint or, on a GPU host, overlapping GPUs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from mbr_launch.config.build import C10D_PORT
from mbr_launch.config.settings import BY_NAME
from mbr_launch.doctor.processes import LauncherProcess, launcher_of

NOT_A_LAUNCH = frozenset({"-h", "--help", "--help-all", "--version"})
_LOCAL = frozenset({"", "localhost", "127.0.0.1", "::1", "0.0.0.0"})


@dataclass(frozen=True)
class Conflict:
    process: LauncherProcess
    why: str  # "uses the same rendezvous endpoint 127.0.0.1:29400" / "can use the same GPUs"


def launch_args(argv: Sequence[str]) -> list[str] | None:
    """The arguments after the launcher's own name (``python -m mbr_launch X`` -> ``[X]``), or None."""
    for i, word in enumerate(argv[:3]):
        if launcher_of([word]) is not None:
            return list(argv[i + 1:])
    return None


def is_launch(argv: Sequence[str]) -> bool:
    """A command line that starts a job: not ``--help``/``--version``, not a subcommand (``doctor``)."""
    args = launch_args(argv)
    if not args or NOT_A_LAUNCH & set(args):
        return False
    # `mbr-launch doctor`, `mbr-launch report`: a bare word first is a subcommand; a script is a path.
    return not (launcher_of(argv) == "mbr-launch" and args[0].isidentifier())


def _flag_value(args: Sequence[str], name: str) -> str | None:
    flags = BY_NAME[name].flags
    for i, arg in enumerate(args):
        if arg in flags and i + 1 < len(args):
            return args[i + 1]
        key, eq, value = arg.partition("=")
        if eq and key in flags:
            return value
    return None


def endpoint_key(host: str | None, port: int | None) -> tuple[str, int] | None:
    if port is None:
        return None
    host = (host or "").strip().strip("[]").lower()
    return ("local" if host in _LOCAL else host, port)


def split_endpoint(endpoint: str, default_port: int) -> tuple[str, int]:
    """"host:port", "host", "[v6]:port" -> (host, port). Raises ValueError quoting the input."""
    text = endpoint.strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port_text = rest.lstrip(":")
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
    else:
        host, port_text = text, ""
    try:
        port = int(port_text) if port_text else default_port
    except ValueError:
        raise ValueError(f"bad port in rendezvous endpoint {endpoint!r}") from None
    if not host or not 0 < port < 65536:
        raise ValueError(f"bad rendezvous endpoint {endpoint!r}: expected HOST:PORT")
    return host, port


def rendezvous_key(*, standalone: bool, endpoint: str | None, master_addr: str | None,
                   master_port: int | None) -> tuple[str, int] | None:
    """Where a launch's rendezvous listens, as a key two launches can be compared by; None when it picks a
    free port (--standalone) or the flags do not say."""
    if standalone:
        return None
    if endpoint:
        try:
            return endpoint_key(*split_endpoint(endpoint, C10D_PORT))
        except ValueError:
            return None
    return endpoint_key(master_addr, master_port)


def rendezvous_of(args: Sequence[str]) -> tuple[str, int] | None:
    port = _flag_value(args, "master_port")
    return rendezvous_key(standalone="--standalone" in args, endpoint=_flag_value(args, "rdzv_endpoint"),
                          master_addr=_flag_value(args, "master_addr"),
                          master_port=int(port) if port and port.isdigit() else None)


def devices(text: str | None) -> set[str] | None:
    """CUDA_VISIBLE_DEVICES as a set of entries; None when unset (every GPU)."""
    if text is None:
        return None
    return {d.strip() for d in text.split(",") if d.strip()}


def conflicts(others: Sequence[LauncherProcess], *, uid: int, env: Mapping[str, str], has_gpus: bool,
              rendezvous: tuple[str, int] | None) -> tuple[list[Conflict], int]:
    """(the launchers that get in the way, how many other launcher processes were left aside)."""
    found: list[Conflict] = []
    relevant = [p for p in others if p.uid == uid and is_launch(p.argv)]
    mine = devices(env.get("CUDA_VISIBLE_DEVICES"))
    for proc in relevant:
        theirs = devices(proc.visible_devices) if proc.env_read else None  # unreadable: it may hold any GPU
        if rendezvous is not None and rendezvous_of(launch_args(proc.argv) or []) == rendezvous:
            found.append(Conflict(proc, f"uses the same rendezvous endpoint ({rendezvous[0]}:{rendezvous[1]})"))
        elif has_gpus and (mine is None or theirs is None or bool(mine & theirs)):  # None: every GPU
            found.append(Conflict(proc, "can use the same GPUs (CUDA_VISIBLE_DEVICES overlaps or is unset)"))
    return found, len(others) - len(relevant)
