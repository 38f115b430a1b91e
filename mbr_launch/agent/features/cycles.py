"""ft_launcher 0.6/0.7's per-cycle features as a round feature. Progress across restarts: ``check`` scores a
failed cycle (``decide.noprogress``) against the job-wide record in the store; the cycle-info files: the
store's host writes them (``report.cycleinfo``). ``CycleRecords`` keeps the records, ``CycleFeature`` feeds them.
"""

from __future__ import annotations

import json
import threading
from typing import Any, Callable, Mapping, Sequence

from mbr_launch import outside
from mbr_launch.agent.context import Context, Feature
from mbr_launch.agent.messages import Progress, RankStarted, RoundResult
from mbr_launch.cluster import storevalue
from mbr_launch.cluster.jobstore import NO_RESTART_KEY, TRACKING_KEY, progress_claim_key
from mbr_launch.cluster.round import Round
from mbr_launch.config.model import LaunchConfig
from mbr_launch.decide.noprogress import (Facts, Rule, Scored, cycle_line, decode, decode_tracking, encode,
                                          encode_tracking, initial, parse_iteration, score)
from mbr_launch.report import cycleinfo
from mbr_launch.report.events import EventLog

FILE_READ_BOUND = 5.0  # seconds a read of the checkpoint iteration file may take (a hung shared file system)

Members = tuple[Sequence[tuple[str, int]], Sequence[str]]  # the round's (address, group rank), nodes outside it


def read_iteration_file(path: str) -> tuple[int | None, str | None]:
    """(iteration, problem): a missing file is no problem (no checkpoint yet); an unreadable one is."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read(4096)
    except FileNotFoundError:
        return None, None
    except OSError as err:
        return None, f"cannot read {path}: {err.strerror or err}"
    value = parse_iteration(text)
    if value is None and text.strip():
        return None, f"{path} holds no integer ({text.strip()[:40]!r})"
    return value, None


def read_bounded(read: Callable[[str], tuple[int | None, str | None]], path: str,
                 bound: float = FILE_READ_BOUND) -> tuple[int | None, str | None]:
    box: list[tuple[int | None, str | None]] = []
    thread = threading.Thread(target=lambda: box.append(read(path)), name="ckpt-iteration", daemon=True)
    thread.start()
    thread.join(bound)
    return box[0] if box else (None, f"reading {path} took more than {bound:g} s")


class CycleRecords:
    def __init__(self, cfg: LaunchConfig, *, log: EventLog, say: Callable[[str], None], node: str,
                 environ: Mapping[str, str], job_store: Callable[[Round], Any],
                 hosts_store: Callable[[Round], bool], members: Callable[[], Members | None],
                 snapshot: Callable[[], dict[str, Any] | None] | None = None,
                 read_file: Callable[[str], tuple[int | None, str | None]] = read_iteration_file) -> None:
        nv = cfg.nvrx
        self.rule = Rule(max_cycles=nv.max_no_progress_cycles, min_iterations=nv.min_progress_iterations,
                         file=nv.checkpoint_iteration_file)
        self.exit_code = nv.no_restart_exit_code
        self._log, self._say, self._node = log, say, node
        self._job_store, self._hosts_store, self._members = job_store, hosts_store, members
        self._snapshot, self._read_file = snapshot, read_file
        self._launch_iteration: int | None = None
        self._iteration: int | None = None  # this round's highest reported training iteration
        self._steps: int | None = None  # this round's most optimizer steps of one rank
        self._unknown_said = False  # one line per run of cycles whose checkpoint iteration is unknown
        self.writer: cycleinfo.Writer | None = None
        self.reporter: cycleinfo.Reporter | None = None
        if nv.cycle_info_dir:
            job_id, attempt = cycleinfo.namespace(nv.cycle_info_job_id, environ)
            self.writer = cycleinfo.Writer(nv.cycle_info_dir, say)
            self.reporter = cycleinfo.Reporter(self.writer, job_id=job_id, attempt=attempt,
                                               log_prefix=nv.per_cycle_applog_prefix)

    @staticmethod
    def wanted(cfg: LaunchConfig) -> bool:
        return cfg.nvrx.max_no_progress_cycles > 0 or bool(cfg.nvrx.cycle_info_dir)

    def start(self) -> None:
        """At launch: the checkpoint iteration the training resumes from."""
        if self.rule.enabled and self.rule.file:
            self._launch_iteration, _ = read_bounded(self._read_file, self.rule.file)

    def begin(self, rnd: Round) -> None:
        self._iteration = self._steps = None
        if self.reporter is None or not self._hosts_store(rnd):
            return
        got = self._members()
        if got is None or len(got[0]) != rnd.group_world_size:  # torch's state unknown (static backend)
            got = ([(self._node, rnd.group_rank)] if rnd.group_world_size == 1 else [], [])
        self.reporter.start(rnd.restart_count, *got)

    def end(self, *, membership: bool = False) -> None:
        """The round ended; one that re-forms to admit nodes keeps its cycle."""
        if self.reporter is not None and not membership:
            self.reporter.end()

    def on_progress(self, payload: Mapping[str, Any]) -> None:
        for row in payload.get("ranks") or []:
            if isinstance(row, Mapping) and row.get("state") != "disarmed":  # a stopped rank's row is the last round's
                self._take(row)

    def _take(self, row: Mapping[str, Any]) -> None:
        iteration, steps = outside.integer(row.get("iteration")), outside.integer(row.get("steps"))
        if iteration is not None:
            self._iteration = iteration if self._iteration is None else max(self._iteration, iteration)
        if steps is not None:
            self._steps = steps if self._steps is None else max(self._steps, steps)

    def check(self, rnd: Round) -> str | None:
        """Score the round ending in a failure; why the job must end (with ``exit_code``), else None. The caller
        bounds the store calls."""
        if not self.rule.enabled:
            return None
        self._catch_up()
        file_iteration = problem = None
        if self.rule.file:
            file_iteration, problem = read_bounded(self._read_file, self.rule.file)
        facts = Facts(cycle=rnd.restart_count, file_iteration=file_iteration, file_problem=problem,
                      iteration=self._iteration, steps=self._steps)
        job = self._job_store(rnd)
        raw = job.read_if_set(TRACKING_KEY)
        tracking = decode_tracking(raw) if raw is not None else None
        mine = score(self.rule, tracking or initial(self.rule, self._launch_iteration), facts)
        won, claimed = job.claim(progress_claim_key(rnd.token), encode(mine))
        scored = mine if won else (decode(claimed or b"") or mine)
        if won:
            job.put(TRACKING_KEY, json.dumps(encode_tracking(scored.tracking)))
            if scored.stop:
                job.put(NO_RESTART_KEY, json.dumps({"exit_code": self.exit_code, "reason": scored.reason}))
        self._record(rnd, scored, won)
        return scored.reason if scored.stop else None

    def _catch_up(self) -> None:
        if self._snapshot is None:
            return
        try:
            snap = self._snapshot() or {}
        except Exception:  # the monitor may be gone with the failure: what the events brought stands
            return
        self.on_progress(snap)

    def _record(self, rnd: Round, scored: Scored, claimed: bool) -> None:
        stuck = scored.tracking.stuck
        self._log.emit("cycle_progress", round=rnd.index, cycle=scored.cycle,
                       source=scored.source.value if scored.source else None, start=scored.start, end=scored.end,
                       progress=scored.progress, no_progress_cycles=len(stuck),
                       max_no_progress_cycles=self.rule.max_cycles, stop=scored.stop, note=scored.note or None,
                       claimed=claimed)
        if scored.progress is None:
            if "unknown" in scored.note and not self._unknown_said:
                self._unknown_said = True
                self._say(f"WARNING: {cycle_line(self.rule, scored)}")
            return
        self._unknown_said = False
        if scored.progress is False and not scored.stop:
            self._say(cycle_line(self.rule, scored))

    def no_restart_line(self, read: Callable[[str], bytes | None]) -> tuple[int, str] | None:
        """For a spare when the job closed: the exit code and line when it ended for lack of progress."""
        raw = read(NO_RESTART_KEY)
        try:
            data = storevalue.decode_json(raw) if raw else None
            code = outside.integer(data["exit_code"], 1, 255)  # a job ended for lack of progress never exits 0
            return (code, outside.text(data["reason"])) if code is not None else None
        except (storevalue.RefusedValue, TypeError, KeyError):
            return None

    def close(self) -> None:
        if self.reporter is not None:
            self.reporter.end()
        if self.writer is not None:
            self.writer.close()


PROGRESS_STATUS_INTERVAL = 1.0  # seconds between status rows when only progress tracking asks for them


class CycleFeature(Feature):
    def __init__(self, records: CycleRecords, *, status_rows: bool) -> None:
        self.records = records
        self._status_rows = status_rows  # the ranks' training iterations come in the monitor's status rows

    def monitor_settings(self) -> dict[str, Any]:
        return {"status_interval": PROGRESS_STATUS_INTERVAL} if self._status_rows else {}

    def closed(self, ctx: Context) -> tuple[int, str] | None:
        return self.records.no_restart_line(ctx.rendezvous.job_get)

    def round_begins(self, ctx: Context, rnd: Round) -> None:
        self.records.begin(rnd)

    def observe(self, ctx: Context, event: RankStarted | Progress) -> None:
        if isinstance(event, Progress):
            self.records.on_progress(event.payload)

    def on_failure(self, ctx: Context, rnd: Round) -> tuple[str, int] | None:
        with ctx.store_call("recording the cycle's progress"):
            stuck = self.records.check(rnd)
        return None if stuck is None else (stuck, self.records.exit_code)

    def round_ended(self, ctx: Context, result: RoundResult) -> None:
        self.records.end(membership=result.message is not None and result.message.membership)

    def close(self) -> None:
        self.records.close()
