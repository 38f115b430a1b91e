"""Stack dumps of hung ranks, taken by the agent before it kills them.

py-spy for all ranks in parallel (``--nonblocking`` the retry), faulthandler for the rest: ``STACK_SIGNAL``
makes the handler ``shim.boot`` armed write into ``MBR_STACK_FILE``, even while a busy loop holds the GIL (a
rank found stopped is resumed for it and stopped again). Each dump is saved, summarised in one line, and
classified for the hang verdict: waiting in a collective (a CUDA synchronize, a store call) or elsewhere.
"""

from __future__ import annotations

import datetime
import linecache
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional, Sequence

from mbr_launch import procstat
from mbr_launch.contract import STACK_SIGNAL
from mbr_launch.decide.verdict import StackClass
from mbr_launch.report.private import write_private
from mbr_launch.report.redact import redact_process_lines
from mbr_launch.report.untrusted import read_at
from mbr_launch.workers import safefile

Method = Literal["auto", "py-spy", "faulthandler"]


@dataclass(frozen=True)
class StackTarget:
    rank: int
    local_rank: int
    pid: int
    faulthandler_file: Optional[Path] = None  # the worker's MBR_STACK_FILE


@dataclass(frozen=True)
class StackDump:
    rank: int
    local_rank: int
    pid: int
    method: str  # "py-spy", "faulthandler", or "none" when every way failed
    path: Optional[Path]
    summary: str  # e.g. "hang at train.py:42: time.sleep(600)"; the failure reason for "none"
    stack_class: StackClass = StackClass.NONE  # the main thread: in a collective wait, or outside any
    where: str = ""  # the innermost user frame (see classify)
    collective: str = ""  # with COLLECTIVE: what it waits in ("all_reduce", "cuda.synchronize", "store", ...)


@dataclass(frozen=True)
class Frame:
    function: str
    filename: str
    line: int


def find_py_spy() -> Optional[str]:
    """py-spy on PATH, or next to this interpreter (a venv that is not activated)."""
    found = shutil.which("py-spy")
    if found:
        return found
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if os.access(beside, os.X_OK) else None


def dump_stacks(
    targets: Sequence[StackTarget], out_dir: Path, *, method: Method = "auto", timeout: float = 10.0
) -> list[StackDump]:
    """Dump every target's Python stacks into ``out_dir``; never raises for a target that fails.
    ``timeout`` bounds the whole call; with ``auto`` a share of it is kept for the fallback."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError:
        pass  # a full disk: the stacks still reach the verdict, without their files
    deadline = time.monotonic() + timeout
    results: dict[int, StackDump] = {}
    failures: dict[int, str] = {}
    py_spy = find_py_spy() if method in ("auto", "py-spy") else None
    if method in ("auto", "py-spy"):
        if py_spy is None:
            failures = {t.pid: "py-spy not found" for t in targets}
        else:
            budget = deadline - min(2.0, timeout / 3) if method == "auto" else deadline
            for target, text, error in _py_spy_all(py_spy, targets, budget):
                if text is not None:
                    results[target.pid] = _save(target, out_dir, "py-spy", text, _py_spy_main_frame(text))
                else:
                    failures[target.pid] = error or "py-spy failed"
    if method == "faulthandler" or (method == "auto" and failures):
        todo = [t for t in targets if t.pid not in results]
        for target, text, error in _faulthandler_all(todo, deadline):
            if text is not None:
                results[target.pid] = _save(target, out_dir, "faulthandler", text, _faulthandler_main_frame(text))
            else:
                failures[target.pid] = "; ".join(x for x in (failures.get(target.pid), error) if x)
    return [
        results.get(t.pid) or StackDump(t.rank, t.local_rank, t.pid, "none", None, failures.get(t.pid, "no dump"))
        for t in targets
    ]


# ---- py-spy ---------------------------------------------------------------------------------------------


def _py_spy_all(
    exe: str, targets: Sequence[StackTarget], deadline: float
) -> list[tuple[StackTarget, Optional[str], Optional[str]]]:
    """Blocking mode for all targets in parallel, then ``--nonblocking`` for those it failed on."""
    first = _run_parallel([[exe, "dump", "--full-filenames", "--pid", str(t.pid)] for t in targets], deadline)
    retry = [i for i, (ok, _) in enumerate(first) if not ok]
    again = [[exe, "dump", "--full-filenames", "--nonblocking", "--pid", str(targets[i].pid)] for i in retry]
    second = _run_parallel(again, deadline)
    for i, res in zip(retry, second):
        if res[0]:
            first[i] = res
        else:
            first[i] = (False, f"{_last_line(first[i][1])}; --nonblocking: {_last_line(res[1])}")
    # py-spy's first line is "Process 1234: <command line>": into the stack file without its secrets (an --api-key)
    return [(t, redact_process_lines(out) if ok else None, None if ok else out) for t, (ok, out) in zip(targets, first)]


def _run_parallel(cmds: list[list[str]], deadline: float) -> list[tuple[bool, str]]:
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for c in cmds]
    results: list[tuple[bool, str]] = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            results.append((False, "timed out"))
            continue
        ok = proc.returncode == 0 and "Thread " in out
        results.append((ok, out if ok else (err.strip() or out.strip() or f"exit {proc.returncode}")))
    return results


def _last_line(text: str) -> str:
    # py-spy prints "Error: ...", a "Caused by:" chain and a backtrace: the Error line says it best.
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return next((ln for ln in lines if ln.startswith("Error:")), lines[-1] if lines else "failed")


_PY_SPY_THREAD = re.compile(r'^Thread (\d+) \(([^)]*)\)(?::\s*"(.*)")?')
_PY_SPY_FRAME = re.compile(r"^\s+(.+?) \((.+):(\d+)\)\s*$")


def _py_spy_main_frame(text: str) -> Optional[Frame]:
    frames = _py_spy_main_frames(text)
    return frames[0] if frames else None


def _py_spy_main_frames(text: str) -> list[Frame]:
    """Frames (innermost first) of the thread named MainThread (else the first thread listed)."""
    blocks: list[tuple[str, list[Frame]]] = []
    for line in text.splitlines():
        head = _PY_SPY_THREAD.match(line)
        if head:
            blocks.append((head.group(3) or "", []))
            continue
        frame = _PY_SPY_FRAME.match(line)
        if frame and blocks:
            blocks[-1][1].append(Frame(frame.group(1), frame.group(2), int(frame.group(3))))
    main = next((b for b in blocks if b[0] == "MainThread" and b[1]), None) or next((b for b in blocks if b[1]), None)
    return main[1] if main else []


# ---- faulthandler ----------------------------------------------------------------------------------------


def _faulthandler_all(
    targets: Sequence[StackTarget], deadline: float
) -> list[tuple[StackTarget, Optional[str], Optional[str]]]:
    files: dict[int, int] = {}  # pid -> its stack file, opened before the signal (safefile: no FIFO, no symlink)
    sizes: dict[int, int] = {}
    errors: dict[int, str] = {}
    restop: set[int] = set()  # found stopped: stopped again once dumped
    try:
        for t in targets:
            if t.faulthandler_file is None:
                errors[t.pid] = "no faulthandler file"
                continue
            try:
                files[t.pid] = safefile.open_owned(t.faulthandler_file)
                sizes[t.pid] = os.fstat(files[t.pid]).st_size
            except OSError as exc:  # missing, or refused (its strerror says why)
                errors[t.pid] = f"faulthandler file: {exc.strerror}"
                continue
            found = procstat.read(t.pid)
            try:
                os.kill(t.pid, STACK_SIGNAL)
                if found is not None and found.state in _STOPPED:
                    os.kill(t.pid, signal.SIGCONT)  # a stopped process runs no signal handlers
                    restop.add(t.pid)
            except ProcessLookupError:
                errors[t.pid] = "process is gone"
            except PermissionError as exc:
                errors[t.pid] = f"cannot signal: {exc.strerror}"
        texts = _wait_for_growth({pid: fd for pid, fd in files.items() if pid not in errors}, sizes, deadline, restop)
    finally:
        for fd in files.values():
            os.close(fd)
    for pid in restop - texts.keys():  # no dump in time: stopped again all the same, as it was found
        _stop(pid)
    out = []
    for t in targets:
        text = texts.get(t.pid)
        out.append((t, text, None if text else errors.get(t.pid, "faulthandler wrote nothing in time")))
    return out


_STOPPED = ("T", "t")
MAX_STACK_BYTES = 8 << 20  # faulthandler writes at most 100 threads of 100 frames, lines of < 600 characters


def _stop(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGSTOP)
    except OSError:
        pass  # gone meanwhile


def _wait_for_growth(pending: dict[int, int], sizes: dict[int, int], deadline: float,
                     restop: set[int] = frozenset()) -> dict[int, str]:  # type: ignore[assignment]
    """The bytes each file (pid -> fd) gained once it settles; a pid in ``restop`` is stopped once dumped."""
    texts: dict[int, str] = {}
    last: dict[int, tuple[int, float]] = {}
    settle = 0.05
    while pending and time.monotonic() < deadline:
        now = time.monotonic()
        for pid, fd in list(pending.items()):
            size = os.fstat(fd).st_size
            if size <= sizes[pid]:
                continue
            prev = last.get(pid)
            if prev is None or prev[0] != size:
                last[pid] = (size, now)
            elif now - prev[1] >= settle:
                texts[pid] = read_at(fd, sizes[pid], min(size - sizes[pid], MAX_STACK_BYTES)).decode(
                    errors="replace")
                del pending[pid]
                if pid in restop:
                    _stop(pid)
        time.sleep(0.01)
    return texts


_FH_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+)")
_FH_FRAME = re.compile(r'^\s+File "(.+)", line (\d+) in (.+)$')


def _faulthandler_main_frame(text: str) -> Optional[Frame]:
    frames = _faulthandler_main_frames(text)
    return frames[0] if frames else None


def _faulthandler_main_frames(text: str) -> list[Frame]:
    """faulthandler names no threads: the main one is the stack not started by ``threading``."""
    blocks: list[list[Frame]] = []
    for line in text.splitlines():
        if _FH_THREAD.match(line):
            blocks.append([])
            continue
        frame = _FH_FRAME.match(line)
        if frame and blocks:
            blocks[-1].append(Frame(frame.group(3), frame.group(1), int(frame.group(2))))
    blocks = [b for b in blocks if b]
    main = next((b for b in blocks if not _is_thread_bootstrap(b[-1])), None) or (blocks[0] if blocks else None)
    return main or []


def _is_thread_bootstrap(frame: Frame) -> bool:
    """The outermost frame of a helper thread: ``threading``'s, or the shim's Flight Recorder thread's."""
    if frame.filename.endswith(os.path.join("shim", "flight.py")):
        return True
    return frame.function == "_bootstrap" and os.path.basename(frame.filename) == "threading.py"


# ---- output ------------------------------------------------------------------------------------------------


def summarize(frame: Optional[Frame]) -> str:
    if frame is None:
        return "no Python frame found"
    where = f"{frame.function} at {os.path.basename(frame.filename)}:{frame.line}"
    source = linecache.getline(frame.filename, frame.line).strip() if os.path.isabs(frame.filename) else ""
    return f"{where}: {source[:80]}" if source else where


def _save(target: StackTarget, out_dir: Path, method: str, text: str, frame: Optional[Frame]) -> StackDump:
    path = out_dir / f"rank{target.rank}.txt"
    header = (
        f"# method: {method}\n# rank: {target.rank} (local rank {target.local_rank})\n# pid: {target.pid}\n"
        f"# time: {datetime.datetime.now().astimezone().isoformat(timespec='milliseconds')}\n\n"
    )
    saved: Optional[Path] = path
    try:
        write_private(path, (header + text).encode())
    except OSError:
        saved = None  # a full disk: the stacks still reach the verdict, without their file
    stack_class, where, collective = classify(text, method)
    return StackDump(target.rank, target.local_rank, target.pid, method, saved, summarize(frame), stack_class,
                     where, collective)


# ---- classification ----------------------------------------------------------------------------------------

# Functions of torch.distributed that block until the peers take part (or a Work/tensor completes).
_WAITS = frozenset({
    "all_reduce", "all_reduce_coalesced", "all_gather", "all_gather_into_tensor", "all_gather_object",
    "all_gather_coalesced", "reduce_scatter", "reduce_scatter_tensor", "broadcast", "broadcast_object_list",
    "barrier", "monitored_barrier", "all_to_all", "all_to_all_single", "send", "recv", "send_object_list",
    "recv_object_list", "reduce", "gather", "gather_object", "scatter", "scatter_object_list",
    "batch_isend_irecv", "init_process_group", "new_group", "_store_based_barrier", "wait", "wait_tensor",
    "_sync_buffers", "_sync_module_buffers", "_default_broadcast_coalesced", "_distributed_broadcast_coalesced",
})
_DIST = os.path.join("torch", "distributed") + os.sep
_DDP = os.path.join("torch", "nn", "parallel", "distributed.py")
_CUDA = os.path.join("torch", "cuda") + os.sep
_TORCH = os.sep + "torch" + os.sep
# C methods are not Python frames: a script blocked in ``work.wait()`` or ``store.get(k)`` shows only its
# own line, so that line's source decides. (``os.wait`` and a dict's ``.get`` are not waits on peers.)
_C_WAIT = re.compile(r"(?<!\bos)\.wait\(|\b\w*store\w*\.(get|wait)\(", re.IGNORECASE)
_LIBRARY = re.compile(r"^<|/lib/python3\.\d+/|/(site|dist)-packages/|/mbr_launch/shim/")


def classify(text: str, method: str) -> tuple[StackClass, str, str]:
    """(class, where, collective) of a dump's main thread (``method``: "py-spy" or "faulthandler")."""
    frames = _py_spy_main_frames(text) if method == "py-spy" else _faulthandler_main_frames(text)
    if not frames:
        return StackClass.NONE, "", ""
    user = next((f for f in frames if not _LIBRARY.search(f.filename)), None)
    if _restarting(frames):
        return StackClass.RESTARTING, summarize(frames[0]), "in-process restart"
    op = _waiting_in(frames)
    if op:
        return StackClass.COLLECTIVE, summarize(user or frames[0]), op
    where = summarize(user or frames[0])
    if user is not None and user is not frames[0]:
        where += f" (in {frames[0].function})"
    return StackClass.OUTSIDE, where, ""


_INPROCESS = os.path.join("nvidia_resiliency_ext", "inprocess") + os.sep
_STDLIB = re.compile(r"^<|/lib/python3\.\d+/(?!(site|dist)-packages/)")


def _restarting(frames: list[Frame]) -> bool:
    """In NVRx's in-process Wrapper between runs of the wrapped function: the innermost frame outside torch and
    the standard library is the Wrapper's (while the function runs, it is the script's)."""
    own = next((f for f in frames if _TORCH not in f.filename and not _STDLIB.search(f.filename)), None)
    return own is not None and _INPROCESS in own.filename


def _waiting_in(frames: list[Frame]) -> str:
    """What the run of torch frames at the top waits in; "" when the thread is elsewhere."""
    for frame in frames:
        name = frame.function.rsplit(".", 1)[-1]
        if _DIST in frame.filename or frame.filename.endswith(_DDP):
            if name in _WAITS:
                return "broadcast" if "broadcast" in name or "sync" in name else name.lstrip("_")
        elif _CUDA in frame.filename and name == "synchronize":
            return "cuda.synchronize"
        elif _TORCH not in frame.filename:
            break
    first = frames[0]
    if _TORCH not in first.filename and not first.filename.startswith("<"):
        match = _C_WAIT.search(linecache.getline(first.filename, first.line))
        if match:
            return "store" if "store" in match.group(0).lower() else "wait"
    return ""
