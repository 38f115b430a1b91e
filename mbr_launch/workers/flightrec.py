"""Flight Recorder, agent side: the workers' environment for it, asking a rank for a dump, reading one.

A rank's dump says, per process group, the last collective it enqueued, started and completed: a rank
whose count is behind its peers' never entered the collective they wait in. Two ways to get one:
- the worker's own thread (``mbr_launch.shim.flight``), woken by a byte on the FIFO ``MBR_FR_TRIGGER``;
  works for gloo and NCCL, needs the GIL for a moment;
- NCCL's pipe (``TORCH_NCCL_DEBUG_INFO_PIPE_FILE``): torch's C++ watchdog polls ``<prefix><rank>.pipe``
  about once a second and writes ``<TORCH_FR_DUMP_TEMP_FILE><rank>``; works while Python is stuck, but
  exists only for NCCL process groups.

What torch 2.13 reads (checked in ``FlightRecorder.hpp`` / ``ProcessGroupNCCL.hpp`` and the strings of
libtorch_cpu.so): ``TORCH_FR_BUFFER_SIZE`` with the older ``TORCH_NCCL_TRACE_BUFFER_SIZE`` as an alias
(default 2000 in FlightRecorder, but gloo recorded nothing here until it was set);
``TORCH_FR_DUMP_TEMP_FILE`` (alias ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``); ``TORCH_INCLUDE_STACK_TRACE``;
``TORCH_NCCL_DEBUG_INFO_PIPE_FILE`` lives in libtorch_cuda (absent from CPU builds).

A dump is a pickle written by the worker: it is read with an unpickler that refuses every global, so a
hostile or garbled file yields no progress rather than code execution or an exception.
"""

from __future__ import annotations

import io
import os
import pickle
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from mbr_launch.contract import FR_FILE_ENV, FR_NCCL_SUFFIX, FR_TRIGGER_ENV
from mbr_launch.decide.verdict import GroupProgress

# In each rank's directory, next to error.json.
TRIGGER_NAME = "fr.trigger"
DUMP_NAME = "fr.pickle"
NCCL_PREFIX = "nccl_fr."  # NCCL's dump: nccl_fr.<rank>; its pipe: nccl_fr.<rank>.pipe

BUFFER_SIZE = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
DUMP_PREFIX = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
PIPE_PREFIX = "TORCH_NCCL_DEBUG_INFO_PIPE_FILE"
MAX_DUMP_BYTES = 64 << 20  # 2000 entries are well under a megabyte
# What flight_env may set in torch's namespace. torch reads them lazily (the recorder when the first process
# group is made, the files when it dumps; checked: importing torch before the buffer size is set still
# records), so a standby that preloaded torch may get them with its assignment.
TORCH_ENV = frozenset({BUFFER_SIZE[0], DUMP_PREFIX[0], PIPE_PREFIX, "TORCH_INCLUDE_STACK_TRACE"})


def flight_env(rank_dir: Path, environ: Mapping[str, str]) -> dict[str, str]:
    """What a worker started through boot gets for Flight Recorder; a name the user set (either spelling)
    is left to them."""
    env: dict[str, str] = {}
    if not any(n in environ for n in BUFFER_SIZE):
        env["TORCH_FR_BUFFER_SIZE"] = "2000"  # gloo records nothing without it (torch 2.13)
    if not any(n in environ for n in DUMP_PREFIX):
        env["TORCH_FR_DUMP_TEMP_FILE"] = str(rank_dir / NCCL_PREFIX)
    if PIPE_PREFIX not in environ:
        env[PIPE_PREFIX] = str(rank_dir / NCCL_PREFIX)
    # Python stacks in a dump need the GIL (a dump could then hang on the very rank that holds it).
    if "TORCH_INCLUDE_STACK_TRACE" not in environ:
        env["TORCH_INCLUDE_STACK_TRACE"] = "0"
    env[FR_TRIGGER_ENV] = str(rank_dir / TRIGGER_NAME)
    env[FR_FILE_ENV] = str(rank_dir / DUMP_NAME)
    return env


def make_trigger(path: Path) -> None:
    """Create the FIFO a worker opens at start (it must exist before the worker does)."""
    try:
        if stat.S_ISFIFO(path.lstat().st_mode):
            return  # a FIFO holds no data once nobody has it open: reusing it asks for nothing
        path.unlink()
    except FileNotFoundError:
        pass
    os.mkfifo(path, 0o600)


@dataclass(frozen=True)
class DumpFiles:
    """Where one worker's dumps land."""

    ours: Path | None  # the shim's dump of the CPU backends' recorder (gloo), written last
    ours_nccl: Path | None  # the shim's dump of NCCL's recorder (CUDA builds), written just before ``ours``
    nccl: Path | None  # NCCL's watchdog dump (written on a pipe request, or on a local timeout)

    def all(self) -> tuple[Path, ...]:
        """In the order a rank's groups are merged: NCCL's recorder first, gloo's last."""
        return tuple(p for p in (self.ours_nccl, self.nccl, self.ours) if p is not None)


def dump_files(env: Mapping[str, str], rank: int) -> DumpFiles:
    """Where a worker with environment ``env`` (and global ``rank``) writes its dumps."""
    ours = Path(env[FR_FILE_ENV]) if env.get(FR_FILE_ENV) else None
    prefix = next((env[n] for n in DUMP_PREFIX if env.get(n)), None)
    return DumpFiles(ours=ours, ours_nccl=Path(f"{ours}{FR_NCCL_SUFFIX}") if ours else None,
                     nccl=Path(f"{prefix}{rank}") if prefix else None)


def trigger_file(env: Mapping[str, str]) -> Path | None:
    return Path(env[FR_TRIGGER_ENV]) if env.get(FR_TRIGGER_ENV) else None


def nccl_pipe(env: Mapping[str, str], rank: int) -> Path | None:
    prefix = env.get(PIPE_PREFIX)
    return Path(f"{prefix}{rank}.pipe") if prefix else None


def trigger(fifo: Path | None, nccl: Path | None = None) -> bool:
    """Ask for a dump without ever blocking; True when a reader got the request on either channel."""
    return any([_poke(p) for p in (fifo, nccl) if p is not None])


def _poke(fifo: Path) -> bool:
    try:
        if not stat.S_ISFIFO(os.stat(fifo).st_mode):
            return False  # never append to a regular file by mistake
        # O_NONBLOCK: open fails with ENXIO when nobody reads (the worker is gone or never armed).
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        os.write(fd, b"d")
        return True
    except BlockingIOError:
        return True  # the pipe is full of earlier requests: one is pending already
    except OSError:
        return False
    finally:
        os.close(fd)


# ---- reading a dump ---------------------------------------------------------------------------------------


class _DataOnly(pickle.Unpickler):
    """A dump holds only dicts, lists, tuples, strings, numbers, booleans and None: no global is needed, and
    refusing all of them leaves a pickle no way to run code."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"global {module}.{name} refused")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("persistent ids refused")


def load(data: bytes) -> Any:
    """The restricted load; None for anything that is not a whole, data-only pickle."""
    try:
        return _DataOnly(io.BytesIO(data)).load()
    except Exception:  # garbage raises anything: EOFError, UnpicklingError, ValueError, KeyError, ...
        return None


def load_file(path: Path) -> Any:
    """A dump file's data (restricted load); None when missing, too big, garbled or hostile."""
    try:
        if path.stat().st_size > MAX_DUMP_BYTES:
            return None
        return load(path.read_bytes())
    except OSError:
        return None


def read_dump(path: Path) -> tuple[GroupProgress, ...]:
    """Per process group progress from one dump file; () when missing, too big, garbled or hostile."""
    return progress(load_file(path))


def progress(dump: Any) -> tuple[GroupProgress, ...]:
    """Per process group progress in loaded dump data; () for data of any other shape."""
    try:
        return _progress(dump)
    except Exception:  # a data-only pickle of an unexpected shape (huge ints, odd keys, ...)
        return ()


def _progress(dump: Any) -> tuple[GroupProgress, ...]:
    if not isinstance(dump, dict) or not isinstance(dump.get("pg_status"), dict):
        return ()
    config = dump.get("pg_config") if isinstance(dump.get("pg_config"), dict) else {}
    entries = dump.get("entries") if isinstance(dump.get("entries"), list) else []
    names: dict[str, str] = {}  # pg id -> group name (pg_config is keyed by name)
    last: dict[str, tuple[int, str]] = {}  # pg id -> (collective_seq_id, op) of its newest entry
    for entry in entries:
        if not isinstance(entry, dict) or entry.get("is_p2p") is True:
            continue
        pg, seq = str(entry.get("pg_id")), entry.get("collective_seq_id")
        group = entry.get("process_group")
        if isinstance(group, (tuple, list)) and group and isinstance(group[0], str):
            names[pg] = group[0]
        if _is_int(seq) and seq >= last.get(pg, (-1, ""))[0]:
            op = entry.get("profiling_name")
            last[pg] = (seq, op.split(":", 1)[-1] if isinstance(op, str) else "")
    out = []
    for pg, status in dump["pg_status"].items():
        if not isinstance(status, dict):
            continue
        pg = str(pg)
        cfg = config.get(names.get(pg, pg))
        ranks = cfg.get("ranks") if isinstance(cfg, dict) else None
        out.append(GroupProgress(pg=pg, enqueued=_counter(status, "last_enqueued_collective"),
                                 started=_counter(status, "last_started_collective"),
                                 completed=_counter(status, "last_completed_collective"),
                                 ranks=_ranks(ranks), last_op=last.get(pg, (-1, ""))[1]))
    return tuple(sorted(out, key=lambda g: (not g.pg.isdigit(), int(g.pg) if g.pg.isdigit() else 0, g.pg)))


def merge(dumps: list[tuple[GroupProgress, ...]]) -> tuple[GroupProgress, ...]:
    """One rank's groups from several dumps, the first dump that names a group winning, except that a
    group that never enqueued anything there gives way (a CUDA build's NCCL recorder lists groups it never
    ran). Callers pass the dumps in the same order for every rank, so ranks stay comparable."""
    chosen: dict[str, GroupProgress] = {}
    for groups in dumps:
        for g in groups:
            if g.pg not in chosen or (chosen[g.pg].enqueued < 0 <= g.enqueued):
                chosen[g.pg] = g
    return tuple(sorted(chosen.values(), key=lambda g: (not g.pg.isdigit(), int(g.pg) if g.pg.isdigit() else 0, g.pg)))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _counter(status: dict, key: str) -> int:
    value = status.get(key)
    return value if _is_int(value) else -1


def _ranks(value: Any) -> tuple[int, ...]:
    # NCCL writes the list as text ("[0, 1]"); gloo writes "[]" for a group it does not describe.
    if isinstance(value, str):
        return tuple(int(n) for n in re.findall(r"-?\d+", value)[:1 << 16])
    if isinstance(value, (list, tuple)):
        return tuple(v for v in value if _is_int(v))
    return ()
