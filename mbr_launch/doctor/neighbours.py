"""Which other launcher processes on this host can get in this job's way (``launcher.per_node``).

Only this user's real launches count: another user's job has its GPUs from the scheduler and is none of
this launch's business, and a ``ft_launcher --help`` or an ``mbr-launch doctor`` starts nothing. Of
those, a launcher conflicts when it uses the same rendezvous endpoint (a second agent of the same job on
this node, or a port clash), or, on a host with GPUs, when it can use the same GPUs (overlapping
CUDA_VISIBLE_DEVICES; unset means all of them). Without GPUs, processes share CPUs as they always do:
only the rendezvous matters.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from mbr_launch.config.settings import BY_NAME
from mbr_launch.doctor.probes import LauncherProcess, launcher_of

NOT_A_LAUNCH = frozenset({"-h", "--help", "--help-all", "--version"})
C10D_PORT, STATIC_PORT = 29400, 29500  # torch's defaults when the port is left out
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


def split_host_port(endpoint: str, default_port: int) -> tuple[str, int] | None:
    host, sep, port = endpoint.strip().rpartition(":")
    if not sep or "]" in port:
        host, port = endpoint.strip(), ""
    try:
        return host, int(port) if port else default_port
    except ValueError:
        return None


def rendezvous_of(args: Sequence[str]) -> tuple[str, int] | None:
    """Where another launcher's rendezvous listens, read from its flags; None when it picks a free port
    (--standalone) or its flags do not say."""
    if "--standalone" in args:
        return None
    if endpoint := _flag_value(args, "rdzv_endpoint"):
        parsed = split_host_port(endpoint, C10D_PORT)
        return endpoint_key(*parsed) if parsed else None
    port = _flag_value(args, "master_port")
    return endpoint_key(_flag_value(args, "master_addr"), int(port)) if port and port.isdigit() else None


def devices(text: str | None) -> set[str] | None:
    """CUDA_VISIBLE_DEVICES as a set of entries; None when unset (every GPU)."""
    if text is None:
        return None
    return {d.strip() for d in text.split(",") if d.strip()}


def share_gpus(mine: set[str] | None, theirs: set[str] | None) -> bool:
    return mine is None or theirs is None or bool(mine & theirs)


def conflicts(others: Sequence[LauncherProcess], *, uid: int, env: Mapping[str, str], has_gpus: bool,
              rendezvous: tuple[str, int] | None) -> tuple[list[Conflict], int]:
    """(the launchers that get in the way, how many other launcher processes were left aside)."""
    found: list[Conflict] = []
    relevant = [p for p in others if p.uid == uid and is_launch(p.argv)]
    mine = devices(env.get("CUDA_VISIBLE_DEVICES"))
    for proc in relevant:
        if rendezvous is not None and rendezvous_of(launch_args(proc.argv) or []) == rendezvous:
            found.append(Conflict(proc, f"uses the same rendezvous endpoint ({rendezvous[0]}:{rendezvous[1]})"))
        # An environment we could not read may hold any devices: assume all of them.
        elif has_gpus and share_gpus(mine, devices(proc.visible_devices) if proc.env_read else None):
            found.append(Conflict(proc, "can use the same GPUs (CUDA_VISIBLE_DEVICES overlaps or is unset)"))
    return found, len(others) - len(relevant)
