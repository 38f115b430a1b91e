"""Flight Recorder, agent side: the workers' environment for it, asking a rank for a dump, reading one.

A dump says, per process group, the last collective a rank enqueued, started and completed: a rank behind its
peers never entered the collective they wait in. It comes from the worker's own thread (``shim.flight``, woken
through the FIFO ``MBR_FR_TRIGGER``; needs the GIL a moment) or NCCL's pipe (torch's C++ watchdog; works while
Python is stuck). A dump may sit where others can write (docs/security.md): it is opened by ``safefile`` and
read by ``loads``, never ``pickle.Unpickler`` (``mbr_launch.unpickle`` says why), under ``DUMP``: data
opcodes only, string keys, bounded opcodes and time. A hostile file yields no progress and a reason.
"""

from __future__ import annotations

import itertools
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from mbr_launch import outside
from mbr_launch.contract import FR_FILE_ENV, FR_NCCL_SUFFIX, FR_TRIGGER_ENV
from mbr_launch.decide.verdict import GroupProgress
from mbr_launch.unpickle.machine import load
from mbr_launch.unpickle.policy import DATA_OPCODES, STACK_OPCODES, PicklePolicy, PickleRefused
from mbr_launch.workers import safefile

# In each rank's directory, next to error.json.
TRIGGER_NAME = "fr.trigger"
DUMP_NAME = "fr.pickle"
NCCL_PREFIX = "nccl_fr."  # NCCL's dump: nccl_fr.<rank>; its pipe: nccl_fr.<rank>.pipe

BUFFER_SIZE = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
DUMP_PREFIX = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
PIPE_PREFIX = "TORCH_NCCL_DEBUG_INFO_PIPE_FILE"
# The caps on a dump: several times a real one (the costliest crafted one: tests/test_hostile_dumps.py).
MAX_DUMP_BYTES = 8 << 20
MAX_DUMP_OPS = 1 << 21
# What is taken from a dump (newest entries are last). Rank lists are cut per group and in all: a memo
# reference (two bytes) can repeat one list for every group, and the evidence travels to every node.
MAX_GROUPS = 1024
MAX_ENTRIES = 1 << 16
MAX_RANKS = 1 << 16
MAX_RANKS_IN_ALL = 1 << 18
# What flight_env may set in torch's namespace: read lazily, so a standby may get them with its assignment.
TORCH_ENV = frozenset({BUFFER_SIZE[0], DUMP_PREFIX[0], PIPE_PREFIX, "TORCH_INCLUDE_STACK_TRACE"})


def flight_env(rank_dir: Path, environ: Mapping[str, str]) -> dict[str, str]:
    """What a worker started through boot gets for Flight Recorder; a name the user set is left to them."""
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
        st = path.lstat()
        if stat.S_ISFIFO(st.st_mode) and st.st_uid == os.geteuid():
            return  # a FIFO holds no data once nobody has it open: reusing it asks for nothing
        path.unlink()
    except FileNotFoundError:
        pass
    os.mkfifo(path, 0o600)


@dataclass(frozen=True)
class DumpFiles:
    ours: Path | None  # the shim's dump of the CPU backends' recorder (gloo), written last
    ours_nccl: Path | None  # the shim's dump of NCCL's recorder (CUDA builds), written just before ``ours``
    nccl: Path | None  # NCCL's watchdog dump (written on a pipe request, or on a local timeout)

    def all(self) -> tuple[Path, ...]:
        """In the order a rank's groups are merged: NCCL's recorder first, gloo's last."""
        return tuple(p for p in (self.ours_nccl, self.nccl, self.ours) if p is not None)


def dump_files(env: Mapping[str, str], rank: int) -> DumpFiles:
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
        if not stat.S_ISFIFO(os.lstat(fifo).st_mode):
            return False  # never write into a regular file by mistake
        # O_NONBLOCK: ENXIO when nobody reads. O_NOFOLLOW: NCCL's pipe may sit where others can write, and a
        # symlink swapped in after the lstat must not get our byte into a file of ours.
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if not stat.S_ISFIFO(st.st_mode) or st.st_uid != os.geteuid():
            return False
        os.write(fd, b"d")
        return True
    except BlockingIOError:
        return True  # the pipe is full of earlier requests: one is pending already
    except OSError:
        return False
    finally:
        os.close(fd)


# ---- reading a dump ---------------------------------------------------------------------------------------

# What a dump is made of (torch's pickler writes protocol 2; Python's 4 and 5); ``max_ops`` is the caller's.
DUMP = PicklePolicy(what="data-only pickle", opcodes=DATA_OPCODES | STACK_OPCODES, max_ops=0,
                    unaccepted="is not data (a global, a set, bytes, ...)", keys_why="a dump's keys are strings")


class NotData(ValueError):
    """Not a whole data-only pickle within the bounds; the message says what was wrong."""


def loads(data: bytes, *, max_ops: int, deadline: float | None = None) -> Any:
    """The object in ``data``; raises ``NotData`` for anything else, never another exception."""
    try:
        return load(data, DUMP, max_ops=max_ops, deadline=deadline)
    except PickleRefused as err:
        raise NotData(str(err)) from None



@dataclass(frozen=True)
class DumpRead:
    data: Any = None  # the loaded data; None when there is none
    problem: str = ""  # why not: "" when the file is simply not there (no dump yet)
    refused: bool = False  # the file itself was refused (a FIFO, a symlink, not ours, too big), not its content


def load_checked(path: Path, *, deadline: float | None = None) -> DumpRead:
    """Read a dump file by the rules above; never raises, never blocks, never reads past ``deadline``."""
    try:
        raw = safefile.read_owned(path, MAX_DUMP_BYTES)
    except FileNotFoundError:
        return DumpRead()
    except OSError as err:  # untrusted.UnsafeFile: there, but not to be read
        return DumpRead(problem=err.strerror or str(err), refused=True)
    try:
        return DumpRead(data=loads(raw, max_ops=MAX_DUMP_OPS, deadline=deadline))
    except NotData as err:
        return DumpRead(problem=str(err))


def progress(dump: Any) -> tuple[GroupProgress, ...]:
    """Per process group progress in loaded dump data; () for data of any other shape."""
    try:
        return _progress(dump)
    except Exception:  # a data-only pickle of an unexpected shape (huge ints, odd keys, ...)
        return ()


def _progress(dump: Any) -> tuple[GroupProgress, ...]:
    if not isinstance(dump, dict) or not isinstance(dump.get("pg_status"), dict):
        return ()
    if len(dump["pg_status"]) > MAX_GROUPS:
        return ()
    config = dump.get("pg_config") if isinstance(dump.get("pg_config"), dict) else {}
    entries = dump.get("entries") if isinstance(dump.get("entries"), list) else []
    names: dict[str, str] = {}  # pg id -> group name (pg_config is keyed by name)
    last: dict[str, tuple[int, Any]] = {}  # pg id -> (collective_seq_id, entry) of its newest entry
    for entry in entries[-MAX_ENTRIES:]:
        if not isinstance(entry, dict) or entry.get("is_p2p") is True:
            continue
        pg, seq = str(entry.get("pg_id")), entry.get("collective_seq_id")
        group = entry.get("process_group")
        if isinstance(group, (tuple, list)) and group and isinstance(group[0], str):
            names[pg] = group[0]
        if (seq := outside.integer(seq)) is not None and seq >= last.get(pg, (-1, None))[0]:
            last[pg] = (seq, entry)
    ranks_of: dict[int, tuple[int, ...]] = {}  # by id: read once, however many groups refer to one list
    out, budget = [], MAX_RANKS_IN_ALL
    for pg, status in dump["pg_status"].items():
        if not isinstance(status, dict):
            continue
        pg = str(pg)
        cfg = config.get(names.get(pg, pg))
        value = cfg.get("ranks") if isinstance(cfg, dict) else None
        if id(value) not in ranks_of:
            ranks_of[id(value)] = _ranks(value)
        ranks = ranks_of[id(value)] if len(ranks_of[id(value)]) <= budget else ()  # (): the dump does not say
        budget -= len(ranks)
        out.append(GroupProgress(pg=pg, enqueued=_counter(status, "last_enqueued_collective"),
                                 started=_counter(status, "last_started_collective"),
                                 completed=_counter(status, "last_completed_collective"),
                                 ranks=ranks, last_op=_op(last.get(pg, (-1, None))[1])))
    return tuple(sorted(out, key=_group_order))


def _op(entry: Any) -> str:
    """The collective of an entry ("nccl:all_reduce" -> "all_reduce"); split once per group, not per entry."""
    op = entry.get("profiling_name") if isinstance(entry, dict) else None
    return op.split(":", 1)[-1] if isinstance(op, str) else ""


def _group_order(g: GroupProgress) -> tuple[bool, int, str]:
    """Numbered groups first, by number; a number too long to be a group id sorts as a name (int() of it is slow)."""
    numbered = g.pg.isdigit() and len(g.pg) < 19
    return not numbered, int(g.pg) if numbered else 0, g.pg


def merge(dumps: list[tuple[GroupProgress, ...]]) -> tuple[GroupProgress, ...]:
    """One rank's groups from several dumps (in the same order for every rank): the first that names a group
    wins, unless it never enqueued there (a CUDA build's NCCL recorder lists groups it never ran)."""
    chosen: dict[str, GroupProgress] = {}
    for groups in dumps:
        for g in groups:
            if g.pg not in chosen or (chosen[g.pg].enqueued < 0 <= g.enqueued):
                chosen[g.pg] = g
    return tuple(sorted(chosen.values(), key=_group_order))


def _counter(status: dict, key: str) -> int:
    value = outside.integer(status.get(key))
    return -1 if value is None else value


def _ranks(value: Any) -> tuple[int, ...]:
    # NCCL writes the list as text ("[0, 1]"); gloo writes "[]" for a group it does not describe.
    if isinstance(value, str):
        return tuple(int(m.group()) for m in itertools.islice(_NUMBER.finditer(value), MAX_RANKS))
    if isinstance(value, (list, tuple)):
        return tuple(v for v in value[:MAX_RANKS] if outside.integer(v) is not None)
    return ()


_NUMBER = re.compile(r"-?\d{1,18}")  # bounded: int() of a long run of digits is slow
