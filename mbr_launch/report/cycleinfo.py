"""NVRx cycle-info files (``--ft-cycle-info-dir``) and the names ft_launcher 0.6/0.7 gives per-cycle files.

Records are in NVRx's schema (protobuf's JSON of ``NVRxCycleInfo``), written when a cycle starts and ends,
atomically (a temporary file, then a rename) and on a thread of their own: a hung shared file system never
holds up a restart.
"""

from __future__ import annotations

import json
import os
import queue
import re
import threading
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Mapping, Sequence

from mbr_launch.decide.verdict_text import consecutive_runs
from mbr_launch.report.private import write_private

ENV = "NVRX_CURRENT_CYCLE_INFO"


# ---- names -----------------------------------------------------------------------------------------------


def info_name(job_id: str, attempt: int, cycle: int) -> str:
    return f"cycle_info.{job_id}.{attempt}.{cycle}"


def current_name(job_id: str) -> str:
    return f"cycle_info.{job_id}.current"


def cycle_log_file(prefix: str, cycle: int) -> str:
    """``--ft-per-cycle-applog-prefix`` /logs/job.log -> /logs/job_cycle3.log (no extension: ``.log``)."""
    base, ext = os.path.splitext(os.path.abspath(prefix))
    return f"{base}_cycle{cycle}{ext or '.log'}"


def namespace(job_id: str | None, environ: Mapping[str, str]) -> tuple[str, int]:
    """(job id, attempt index) of the files: ``job_id`` or Slurm's job id, and Slurm's restart count (a
    requeued job keeps its attempts' files apart)."""
    env_job = environ.get("SLURM_ARRAY_JOB_ID") or environ.get("SLURM_JOB_ID") or ""
    try:
        attempt = int(environ.get("SLURM_RESTART_COUNT", "0"))
    except ValueError:
        attempt = 0
    return (env_job if job_id is None else job_id), attempt


def current_path(info_dir: str, job_id: str | None, environ: Mapping[str, str]) -> str:
    return os.path.join(os.path.abspath(info_dir.rstrip("/") or "/"), current_name(namespace(job_id, environ)[0]))


# ---- Slurm's range notation, as NVRx writes it -------------------------------------------------------------

_NUMBERED = re.compile(r"^(.*?)(\d+)$")


def _short(addr: str) -> str:
    return addr.split(".")[0].strip()


def _sort_key(addr: str) -> tuple[int, str, int]:
    m = _NUMBERED.match(_short(addr))
    return (0, m.group(1), int(m.group(2))) if m else (1, _short(addr), 0)


def nodelist(addrs: Sequence[str]) -> str:
    """["node001.x", "node002", "node005"] -> "node[001-002,005]"; names without a number: "a,b"."""
    names = [_short(a) for a in addrs if a and _short(a)]
    if not names:
        return ""
    parsed = [_NUMBERED.match(n) for n in names]
    if not all(parsed):
        return ",".join(sorted(set(names)))
    by_prefix: dict[str, dict[int, str]] = {}
    for m in parsed:
        assert m is not None
        by_prefix.setdefault(m.group(1), {})[int(m.group(2))] = m.group(2)
    parts = []
    for prefix in sorted(by_prefix):
        numbers = by_prefix[prefix]
        pad = max(len(raw) for raw in numbers.values())
        parts.append(f"{prefix}[{','.join(_ranges(sorted(numbers), pad))}]")
    return ",".join(parts)


def rank_ranges(ranks: Sequence[int]) -> str:
    """[0, 1, 2, 5, 6] -> "0-2,5-6", in the order given."""
    return ",".join(_ranges(list(ranks), 0))


def _ranges(numbers: list[int], pad: int) -> list[str]:
    out: list[str] = []
    for low, high in consecutive_runs(numbers):
        first, last = str(low).zfill(pad), str(high).zfill(pad)
        out.append(first if low == high else f"{first}-{last}")
    return out


def active(members: Sequence[tuple[str, int]]) -> tuple[str, str]:
    """(active_nodes, active_ranks) of a round's (address, group rank) pairs: ranks in the nodes' order."""
    ordered = sorted(members, key=lambda m: (_sort_key(m[0]), m[1]))
    return nodelist([a for a, _ in ordered]), rank_ranges([r for _, r in ordered])


# ---- the record ------------------------------------------------------------------------------------------


def utc_now() -> str:
    """NVRx's time stamps: ISO 8601, UTC, microseconds, ``Z``."""
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


@dataclass(frozen=True)
class CycleInfo:
    job_id: str
    attempt_index: int
    cycle_number: int
    cycle_start_time: str
    cycle_end_time: str = ""
    cycle_log_file: str = ""
    active_nodes: str = ""
    standby_nodes: str = ""
    generation: int = 0
    active_ranks: str = ""

    @property
    def name(self) -> str:
        return info_name(self.job_id, self.attempt_index, self.cycle_number)

    def to_json(self) -> str:
        """As NVRx's ``json_format.MessageToJson(indent=2, ...)``: uint64 values are strings in protobuf's JSON."""
        return json.dumps({**asdict(self), "generation": str(self.generation)}, indent=2)


class Reporter:
    """Which cycle is open, and what to write when one starts or ends (the host's agent calls it)."""

    def __init__(self, write: Callable[[CycleInfo, bool], None], *, job_id: str, attempt: int,
                 log_prefix: str | None, now: Callable[[], str] = utc_now) -> None:
        self._write = write  # (record, point the .current link at it)
        self._job_id, self._attempt, self._prefix, self._now = job_id, attempt, log_prefix, now
        self.current: CycleInfo | None = None  # the open cycle's record, as last written

    def start(self, cycle: int, members: Sequence[tuple[str, int]], standby: Sequence[str] = ()) -> None:
        """A round started; one with the open cycle's number (re-formed to admit nodes) rewrites its file."""
        nodes, ranks = active(members)
        if self.current is not None and self.current.cycle_number == cycle:
            self.current = replace(self.current, active_nodes=nodes, active_ranks=ranks,
                                   standby_nodes=nodelist(standby), cycle_end_time="",
                                   generation=self.current.generation + 1)
            self._write(self.current, False)
            return
        self.end()
        self.current = CycleInfo(job_id=self._job_id, attempt_index=self._attempt, cycle_number=cycle,
                                 cycle_start_time=self._now(),
                                 cycle_log_file=cycle_log_file(self._prefix, cycle) if self._prefix else "",
                                 active_nodes=nodes, standby_nodes=nodelist(standby), active_ranks=ranks)
        self._write(self.current, True)

    def end(self) -> None:
        if self.current is None:
            return
        ended = replace(self.current, cycle_end_time=self._now(), generation=self.current.generation + 1)
        self.current = None
        self._write(ended, False)


class Writer:
    """Writes records into ``info_dir`` on a thread of its own (started with the first record)."""

    def __init__(self, info_dir: str, warn: Callable[[str], None]) -> None:
        self.dir = Path(os.path.abspath(info_dir.rstrip("/") or "/"))
        self._warn = warn
        self._queue: queue.SimpleQueue[tuple[CycleInfo, bool] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._warned = False

    def __call__(self, record: CycleInfo, link: bool) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="cycle-info", daemon=True)
            self._thread.start()
        self._queue.put((record, link))

    def close(self, timeout: float = 5.0) -> None:
        """Write what is queued (for at most ``timeout`` seconds: a hung file system must not hold the exit)."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            try:
                self.write(*item)
            except OSError as err:
                if not self._warned:
                    self._warned = True
                    self._warn(f"WARNING: cannot write the cycle-info file for cycle {item[0].cycle_number} in "
                               f"{self.dir}: {err}; the job goes on without it")

    def write(self, record: CycleInfo, link: bool) -> None:
        os.makedirs(self.dir, exist_ok=True)
        path = self.dir / record.name
        tmp = path.with_name(path.name + ".tmp")
        write_private(tmp, record.to_json().encode())
        os.replace(tmp, path)
        if link:
            current = self.dir / current_name(record.job_id)
            tmp_link = current.with_name(current.name + ".tmp")
            try:
                os.unlink(tmp_link)
            except FileNotFoundError:
                pass
            os.symlink(record.name, tmp_link)  # relative, as NVRx's: the folder can move
            os.replace(tmp_link, current)
