"""Issue #29, Flight Recorder and stack files: what a hostile user of the same host can leave where the agent
reads a rank's dump (``TORCH_FR_DUMP_TEMP_FILE`` in a shared directory) or its faulthandler stacks.

The findings, each a test here: a FIFO at the dump path froze the agent (SIGINT and SIGTERM only queue);
a symlink to /dev/zero was read until memory ran out; a crafted dump cost 37 s of CPU. Also a file of
another user, a crafted dump within the caps, and the preflight that refuses a dump directory others can
write (``fs.flight_recorder``, also in ``mbr-launch doctor``). The readers are called directly (pytest's
process alone); one test runs the command line.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import resource
import stat
import struct
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Iterator

import pytest

from mbr_launch.contract import FR_FILE_ENV, FR_TRIGGER_ENV
from mbr_launch.decide.verdict import GroupProgress
from mbr_launch.workers import flightrec
from mbr_launch.workers.evidence import gather
from mbr_launch.workers.stacks import StackTarget, dump_stacks

from testkit.helpers import launcher_env, read_dump, run_launcher

pytestmark = pytest.mark.timeout(60)

# A refusal is a few system calls; the margin is for a loaded two-core machine.
PROMPT = 1.0
# No process can have this pid (the kernel's pid_max is at most 2**22): a signal sent to it fails at once.
NO_SUCH_PID = (1 << 22) + 1
GOOD = {"pg_status": {"0": {"last_enqueued_collective": 3, "last_started_collective": 3,
                            "last_completed_collective": 2}},
        "entries": [{"pg_id": 0, "collective_seq_id": 3, "profiling_name": "gloo:all_reduce"}]}
GOOD_PROGRESS = (GroupProgress("0", 3, 3, 2, (), "all_reduce"),)


def _in_thread(fn, *args):
    """Run ``fn`` in a thread and give it ``PROMPT`` seconds: (finished, result)."""
    box: list = []
    thread = threading.Thread(target=lambda: box.append(fn(*args)), daemon=True)
    thread.start()
    thread.join(PROMPT * 5)
    return not thread.is_alive(), (box[0] if box else None)


@contextlib.contextmanager
def _memory_cap(extra: int) -> Iterator[None]:
    """This process may grow by ``extra`` bytes of address space, no more, meanwhile: a reader that follows a
    symlink to /dev/zero fails with MemoryError instead of taking the machine's memory."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    pages = int(Path("/proc/self/statm").read_text().split()[0])
    resource.setrlimit(resource.RLIMIT_AS, (pages * os.sysconf("SC_PAGE_SIZE") + extra, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


# ---- finding (a): a FIFO at the dump path --------------------------------------------------------------------


def test_a_fifo_at_the_dump_path_is_refused_at_once(tmp_path):
    fifo = tmp_path / "nccl_trace_0"
    os.mkfifo(fifo)
    try:
        done, groups = _in_thread(read_dump, fifo)
        assert done, "reading a FIFO planted at the dump path blocked"
        assert groups == ()
        read = flightrec.load_checked(fifo)
        assert read.data is None and read.refused and "FIFO" in read.problem, read
    finally:
        # A reader blocked in open() (the old one) gets its writer and EOF, so no thread stays behind.
        with contextlib.suppress(OSError):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


class _Worker(SimpleNamespace):
    """What ``gather`` reads of a worker: this process stands in for a live rank (nothing signals it)."""


def test_a_fifo_planted_during_an_inquiry_is_recorded_and_the_bound_holds(tmp_path):
    rank_dir, shared = tmp_path / "rank0", tmp_path / "shared"
    rank_dir.mkdir()
    shared.mkdir()
    trigger = rank_dir / flightrec.TRIGGER_NAME
    flightrec.make_trigger(trigger)
    reader = os.open(trigger, os.O_RDWR | os.O_NONBLOCK)  # the rank's Flight Recorder thread, ready to be asked
    env = {FR_TRIGGER_ENV: str(trigger), FR_FILE_ENV: str(rank_dir / flightrec.DUMP_NAME),
           "TORCH_FR_DUMP_TEMP_FILE": str(shared / "fr_")}
    worker = _Worker(alive=True, pid=os.getpid(), rank=5, local_rank=0, spec=SimpleNamespace(env=env))
    # The neighbour answers the dump request with a FIFO at NCCL's dump path.
    planter = threading.Timer(0.2, os.mkfifo, (shared / "fr_5",))
    said: list[str] = []
    planter.start()
    try:
        t0 = time.monotonic()
        [ev] = gather([worker], node="n1", group_rank=0, out_dir=tmp_path / "stacks", stack_method="off",
                      bound=1.0, warn=said.append)
        elapsed = time.monotonic() - t0
    finally:
        planter.cancel()
        os.close(reader)
        with contextlib.suppress(OSError):
            os.close(os.open(shared / "fr_5", os.O_WRONLY | os.O_NONBLOCK))
    assert elapsed < 1.0 + PROMPT, elapsed
    assert ev.progress == ()
    assert len(said) == 1 and "rank 5" in said[0] and str(shared / "fr_5") in said[0] and "FIFO" in said[0], said


# ---- finding (b): a symlink to /dev/zero ---------------------------------------------------------------------


def test_a_symlink_to_dev_zero_is_refused_not_read(tmp_path):
    link = tmp_path / "nccl_trace_0"
    link.symlink_to("/dev/zero")
    t0 = time.process_time()
    with _memory_cap(512 << 20):
        groups = read_dump(link)
        read = flightrec.load_checked(link)
    assert groups == () and read.refused and "symbolic link" in read.problem, read
    assert time.process_time() - t0 < PROMPT


def test_a_symlink_to_a_real_dump_of_ours_is_refused_too(tmp_path):
    real = tmp_path / "elsewhere.pickle"
    real.write_bytes(pickle.dumps(GOOD))
    assert read_dump(real) == GOOD_PROGRESS
    link = tmp_path / "nccl_trace_0"
    link.symlink_to(real)
    assert read_dump(link) == ()
    assert "symbolic link" in flightrec.load_checked(link).problem


# ---- finding (c): a crafted dump that costs the reader its CPU ----------------------------------------------


def _binunicode(text: bytes) -> bytes:
    return b"X" + struct.pack("<I", len(text)) + text


def _short(text: str) -> bytes:
    raw = text.encode()
    return b"\x8c" + bytes([len(raw)]) + raw


OP_NAME = b"x" * (64 << 10)


def _entries_repeated(size: int) -> bytes:
    """A dump whose one entry (with a long op name) stands about ``size / 2`` times in its entry list, each
    time by a two-byte memo reference: the old reader split the long name once per reference."""
    entry = (b"}q\x01(" + _short("pg_id") + b"K\x00" + _short("collective_seq_id") + b"K\x05"
             + _short("profiling_name") + _binunicode(OP_NAME) + b"u")
    head = (b"\x80\x02}(" + _short("pg_status") + b"}(" + _short("0") + b"}(" + _short("last_enqueued_collective")
            + b"K\x05uu" + _short("entries") + b"](" + entry)
    return head + b"h\x01" * ((size - len(head)) // 2) + b"eu."


def test_a_dump_over_the_cap_is_refused_before_it_is_read(tmp_path):
    """12 MiB (the cap is 8; the old reader took up to 64 and spent 143 s of CPU on this one)."""
    path = tmp_path / "nccl_trace_0"
    path.write_bytes(_entries_repeated(12 << 20))
    t0 = time.process_time()
    groups = read_dump(path)
    elapsed = time.process_time() - t0
    assert groups == () and elapsed < PROMPT, f"{elapsed:.1f} s of CPU for a dump over the cap"
    read = flightrec.load_checked(path)
    assert read.refused and f"more than the {flightrec.MAX_DUMP_BYTES} we read" in read.problem, read


def test_a_dump_within_the_caps_costs_a_bounded_read(tmp_path):
    """Two million references to one entry, just under the opcode cap (the old reader: 45 s of CPU)."""
    path = tmp_path / "nccl_trace_0"
    path.write_bytes(data := _entries_repeated((4 << 20) - (64 << 10)))
    t0 = time.process_time()
    groups = read_dump(path)
    assert time.process_time() - t0 < 5.0
    assert groups == (GroupProgress("0", 5, -1, -1, (), OP_NAME.decode()),)
    assert len(data) <= flightrec.MAX_DUMP_BYTES and len(data) // 2 < flightrec.MAX_DUMP_OPS


def test_int_keys_that_all_hash_alike_are_refused_at_the_first(tmp_path):
    """The old reader built any dict: 30,000 int keys equal modulo 2**61-1 took it seconds (quadratic)."""
    same_hash = (1 << 61) - 1
    keys = (pickle.dumps(k * same_hash, protocol=2)[2:-1] + b"}" for k in range(30_000))  # not a dict here too
    path = tmp_path / "nccl_trace_0"
    path.write_bytes(b"\x80\x02}(" + _short("pg_status") + b"}(" + b"".join(keys) + b"uu.")
    t0 = time.process_time()
    groups = read_dump(path)
    elapsed = time.process_time() - t0
    assert groups == () and "dict key of type int" in flightrec.load_checked(path).problem
    assert elapsed < PROMPT, f"{elapsed:.1f} s of CPU"


def _many_keys(size: int) -> bytes:
    """The costliest dump found within the caps: one dict of distinct short string keys, up to the opcode cap."""
    pairs = min((size - 16) // 8, flightrec.MAX_DUMP_OPS // 2 - 8)
    return b"\x80\x02}(" + b"".join(_short(f"{i:05x}") + b"N" for i in range(pairs)) + b"u."


@pytest.mark.parametrize("craft", ["many_keys", "opcode_cap", "shared_ranks"])
def test_crafted_dumps_at_the_caps_cost_seconds_at_most(tmp_path, craft):
    if craft == "many_keys":
        data = _many_keys(flightrec.MAX_DUMP_BYTES)
    elif craft == "opcode_cap":  # an empty dict per byte, past the opcode cap
        data = b"\x80\x02](" + b"}" * (flightrec.MAX_DUMP_BYTES - 8) + b"e."
    else:  # every group refers to one rank list of half a million ranks
        ranks = _binunicode(b"7," * 500_000)
        cfg = b"".join(_short(str(g)) + (b"}(" + _short("ranks") + ranks + b"uq\x01" if g == 0 else b"h\x01")
                       for g in range(flightrec.MAX_GROUPS))
        status = b"".join(_short(str(g)) + b"}(" + _short("last_enqueued_collective") + b"K\x01u"
                          for g in range(flightrec.MAX_GROUPS))
        data = (b"\x80\x02}(" + _short("pg_config") + b"}(" + cfg + b"u" + _short("pg_status") + b"}(" + status
                + b"uu.")
    assert len(data) <= flightrec.MAX_DUMP_BYTES
    path = tmp_path / "nccl_trace_0"
    path.write_bytes(data)
    t0 = time.process_time()
    groups = read_dump(path)
    assert time.process_time() - t0 < 5.0
    if craft == "shared_ranks":
        assert len(groups) == flightrec.MAX_GROUPS
        assert sum(len(g.ranks) for g in groups) <= flightrec.MAX_RANKS_IN_ALL
    else:
        assert groups == ()


# ---- a file that is not ours ---------------------------------------------------------------------------------


@pytest.mark.skipif(os.geteuid() != 0, reason="making a file of another uid needs root")
def test_a_dump_of_another_user_is_refused(tmp_path):
    path = tmp_path / "nccl_trace_0"
    path.write_bytes(pickle.dumps(GOOD))
    os.chown(path, 65534, 65534)
    assert read_dump(path) == ()
    read = flightrec.load_checked(path)
    assert read.refused and "belongs to uid 65534" in read.problem, read
    os.chown(path, 0, 0)
    assert read_dump(path) == GOOD_PROGRESS


def test_a_hard_link_to_a_file_of_ours_is_refused(tmp_path):
    real = tmp_path / "elsewhere.pickle"
    real.write_bytes(pickle.dumps(GOOD))
    os.link(real, tmp_path / "nccl_trace_0")
    assert "hard links" in flightrec.load_checked(tmp_path / "nccl_trace_0").problem


# ---- the other files the agent reads or writes by name -------------------------------------------------------


@pytest.mark.parametrize("plant", ["fifo", "symlink"])
def test_a_planted_stack_file_is_refused_before_any_signal(tmp_path, plant):
    """The faulthandler stack file is opened before the rank is signalled: a refused one is never signalled
    for (the pid here cannot exist, so a signal would say "process is gone" instead)."""
    path = tmp_path / "stacks.faulthandler.txt"
    if plant == "fifo":
        os.mkfifo(path)
    else:
        (tmp_path / "other.log").write_text("a log of ours that grows\n")
        path.symlink_to(tmp_path / "other.log")
    t0 = time.monotonic()
    [dump] = dump_stacks([StackTarget(rank=0, local_rank=0, pid=NO_SUCH_PID, faulthandler_file=path)],
                         tmp_path / "out", method="faulthandler", timeout=2.0)
    assert time.monotonic() - t0 < PROMPT
    assert dump.method == "none" and ("FIFO" if plant == "fifo" else "symbolic link") in dump.summary, dump


def test_a_dump_request_never_follows_a_symlink(tmp_path):
    fifo = tmp_path / "ours.pipe"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
    try:
        assert flightrec.trigger(fifo) is True
        os.read(reader, 16)
        (tmp_path / "nccl_trace_0.pipe").symlink_to(fifo)
        assert flightrec.trigger(None, tmp_path / "nccl_trace_0.pipe") is False
        with pytest.raises(BlockingIOError):
            os.read(reader, 16)  # nothing came through the link
    finally:
        os.close(reader)


# ---- the preflight and the doctor ----------------------------------------------------------------------------


def _shared_dir(tmp_path: Path, mode: int = 0o1777) -> Path:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, mode)  # as /tmp is: anyone may create names, the sticky bit only stops deletes
    return shared


def _real(path: Path) -> str:
    return os.path.realpath(path)


def _finding(env: dict[str, str]):
    from mbr_launch.doctor import DoctorContext
    from mbr_launch.doctor.host import flight_recorder

    return flight_recorder(DoctorContext.from_values(env=env))


def test_doctor_names_a_dump_directory_others_can_write(tmp_path):
    shared = _shared_dir(tmp_path)
    found = _finding({"TORCH_FR_DUMP_TEMP_FILE": f"{shared}/nccl_trace_"})
    assert found.severity == "error", found
    assert f"TORCH_FR_DUMP_TEMP_FILE={shared}/nccl_trace_: everyone can write {_real(shared)}" in found.saw
    assert "sticky bit" in found.saw and "mkdir -m 700" in found.fix and "unset TORCH_FR_DUMP_TEMP_FILE" in found.fix
    # The alias, and NCCL's pipe, the same way.
    assert _finding({"TORCH_NCCL_DEBUG_INFO_TEMP_FILE": f"{shared}/t"}).severity == "error"
    assert _finding({"TORCH_NCCL_DEBUG_INFO_PIPE_FILE": f"{shared}/p"}).severity == "error"


def test_doctor_accepts_the_default_and_a_private_directory(tmp_path):
    assert _finding({}).severity == "ok" and "run folder" in _finding({}).saw
    private = tmp_path / "fr"
    private.mkdir(mode=0o700)
    assert _finding({"TORCH_FR_DUMP_TEMP_FILE": f"{private}/nccl_trace_"}).severity == "ok"


@pytest.mark.parametrize("case", ["group_shared", "group_own", "owner_other", "missing_in_shared",
                                  "parent_without_sticky", "symlink_of_other"])
def test_planting_risk(tmp_path, case):
    from mbr_launch.workers.safefile import planting_risk

    if os.geteuid() != 0 and case in ("group_shared", "group_own", "owner_other", "symlink_of_other"):
        pytest.skip("needs root to give a file to another user or group, and root's group to be its own")
    d = tmp_path / "d"
    d.mkdir(mode=0o700)
    if case == "group_shared":
        os.chown(d, -1, 100)  # a group of many users
        os.chmod(d, 0o770)
        assert "can write" in (planting_risk(d) or "")
    elif case == "group_own":
        os.chmod(d, 0o770)  # group root: root's own (no other member)
        assert planting_risk(d) is None
    elif case == "owner_other":
        os.chown(d, 65534, -1)
        assert "belongs to uid 65534" in (planting_risk(d) or "")
    elif case == "missing_in_shared":
        shared = _shared_dir(tmp_path)
        assert "everyone can write" in (planting_risk(shared / "not" / "yet") or "")
        assert planting_risk(d / "not" / "yet") is None
    elif case == "parent_without_sticky":
        os.chmod(tmp_path, 0o777)
        try:
            assert "no sticky bit" in (planting_risk(d) or "")
        finally:
            os.chmod(tmp_path, 0o700)
    else:
        link = tmp_path / "link"
        link.symlink_to(d)
        os.lchown(link, 65534, 65534)
        assert "symbolic link of uid 65534" in (planting_risk(link) or "")


def test_the_preflight_stops_before_anything_starts(tmp_path):
    from rich.console import Console

    from mbr_launch.doctor import DoctorContext, check_ids, preflight

    shared = _shared_dir(tmp_path)
    ctx = DoctorContext.from_values(env={"TORCH_FR_DUMP_TEMP_FILE": f"{shared}/fr_"})
    buf = io.StringIO()
    others = set(check_ids(only_cheap=True)) - {"fs.flight_recorder"}
    assert preflight(ctx, skip=others, console=Console(file=buf, width=200)) is False
    assert "error fs.flight_recorder: TORCH_FR_DUMP_TEMP_FILE=" in buf.getvalue()


@pytest.mark.processes
def test_the_launcher_refuses_a_shared_dump_directory(tmp_path):
    from mbr_launch.doctor import check_ids

    shared = _shared_dir(tmp_path)
    script = tmp_path / "train.py"
    script.write_text("open(__file__ + '.ran', 'w').close()\n")
    others = sorted(set(check_ids(only_cheap=True)) - {"fs.flight_recorder"})
    out = run_launcher(["--standalone", "--nproc-per-node", "1", "--standby", "off", "--log-dir",
                        str(tmp_path / "logs"), "--skip-check", ",".join(others), str(script)],
                       timeout=40, env=launcher_env(TORCH_FR_DUMP_TEMP_FILE=f"{shared}/fr_"))
    err = out.stderr
    assert out.returncode == 2, (out.returncode, err)
    assert "Traceback" not in err and not Path(f"{script}.ran").exists(), err
    flat = "".join(err.split())  # the preflight's lines are wrapped to the terminal's width, paths too
    said = f"error fs.flight_recorder: TORCH_FR_DUMP_TEMP_FILE={shared}/fr_: everyone can write {_real(shared)}"
    assert flat.startswith("".join(said.split())) and "fix:unsetTORCH_FR_DUMP_TEMP_FILE" in flat, err
    assert err.strip().splitlines()[-1].startswith("mbr-launch: error: preflight checks failed"), err
    assert stat.S_IMODE(os.stat(shared).st_mode) == 0o1777 and not any(shared.iterdir())
