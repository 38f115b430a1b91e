"""A node's hang evidence from real workers: a 2-rank gloo job started through the boot shim with the
environment the launcher gives it, where rank 1 stops calling collectives (sleeps, spins, or is stopped)
while rank 0 waits in all_reduce. Plus the readers on canned and hostile input."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from mbr_launch.contract import FR_FILE_ENV, FR_TRIGGER_ENV, STACK_FILE_ENV
from mbr_launch.decide.verdict import GroupProgress, ProcState, StackClass
from mbr_launch.report.exitstatus import ExitStatus
from mbr_launch.workers import evidence, flightrec
from mbr_launch.workers.evidence import gather
from mbr_launch.workers.process import Worker, WorkerSpec, spawn, stop_all
from mbr_launch.workers.stacks import classify, find_py_spy
from mbr_launch.workers.standbypool import mismatched_keys

from testkit.helpers import free_port, read_dump

pytestmark = pytest.mark.timeout(120)
REPO = Path(__file__).resolve().parents[1]
BOUND = 2.0
# Process start/teardown of the dump tools on two shared cores (at load 10 more than 0.6 s); the bound still
# shows: without it the stack dumps' own timeout (workers.stacks, 10 s) would be waited out.
MARGIN = 5.0

TRAIN = textwrap.dedent(
    """
    import os, sys, time
    import torch, torch.distributed as dist

    def hang_sleep():
        time.sleep(600)

    def hang_busy():
        x = 0
        while True:
            x += 1

    dist.init_process_group("gloo")
    t = torch.ones(1)
    for _ in range(3):
        dist.all_reduce(t)
    open(os.environ["READY_FILE"], "w").close()
    if dist.get_rank() == 1:
        (hang_busy if sys.argv[1] == "busy" else hang_sleep)()
    dist.all_reduce(t)
    """
)


@pytest.fixture
def job(tmp_path):
    """Start the 2-rank job as the launcher would (own session, boot shim, Flight Recorder environment)."""
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    workers: list[Worker] = []

    def start(mode: str) -> list[Worker]:
        port = free_port()
        for lr in range(2):
            rank_dir = tmp_path / "attempt_0" / str(lr)
            rank_dir.mkdir(parents=True)
            flightrec.make_trigger(rank_dir / flightrec.TRIGGER_NAME)
            env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_FR", "TORCH_NCCL"))}
            env.update(PYTHONPATH=str(REPO), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(lr),
                       LOCAL_RANK=str(lr), WORLD_SIZE="2", OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore",
                       READY_FILE=str(rank_dir / "ready"), **{STACK_FILE_ENV: str(rank_dir / "stacks.txt")})
            env.update(flightrec.flight_env(rank_dir, env))
            spec = WorkerSpec(local_rank=lr, rank=lr, env=env, stdout=subprocess.DEVNULL, stderr=None,
                              argv=[sys.executable, "-u", "-m", "mbr_launch.shim.boot", str(script), mode])
            workers.append(spawn(spec))
        deadline = time.monotonic() + 60
        while not all((tmp_path / "attempt_0" / str(lr) / "ready").exists() for lr in range(2)):
            assert time.monotonic() < deadline and all(w.proc.poll() is None for w in workers), "job did not start"
            time.sleep(0.05)
        time.sleep(0.5)  # rank 0 on into its fourth all_reduce, rank 1 into its hang
        return list(workers)

    yield start
    stop_all(workers, first_signal=signal.SIGKILL, grace=5)


def _gather(workers, tmp_path, method="auto"):
    t0 = time.monotonic()
    ev = gather(workers, node="n1", group_rank=0, out_dir=tmp_path / "stacks", stack_method=method, bound=BOUND,
                monitor_rows=[{"local_rank": 1, "last_heartbeat_age": 3.5, "last_step_age": 9.0,
                               "open_sections": ["step"], "steps": 7},
                              {"local_rank": 0, "last_heartbeat_age": None, "last_step_age": 2.0}],
                expired={1: "section"})
    elapsed = time.monotonic() - t0
    assert elapsed < BOUND + MARGIN, elapsed
    return ev


def _default_group(ev) -> GroupProgress:
    return next(g for g in ev.progress if g.pg == "0")


def _check_waiting_rank_0(ev0) -> None:
    assert ev0.stack is StackClass.COLLECTIVE and ev0.collective == "all_reduce", ev0
    assert ev0.state is ProcState.SLEEPING and "train.py" in ev0.where, ev0


@pytest.mark.processes
@pytest.mark.parametrize("method", ["auto", "faulthandler"])
def test_sleeping_rank_is_outside_and_behind_while_its_peer_waits_in_all_reduce(job, tmp_path, method):
    ev0, ev1 = _gather(job("sleep"), tmp_path, method)
    _check_waiting_rank_0(ev0)
    assert ev1.stack is StackClass.OUTSIDE and ev1.where.startswith("hang_sleep at train.py"), ev1
    assert ev1.state is ProcState.SLEEPING
    g0, g1 = _default_group(ev0), _default_group(ev1)
    assert g0.enqueued == g1.enqueued + 1 and g1.completed == g1.enqueued, (g0, g1)
    assert g0.last_op == g1.last_op == "all_reduce"
    # The monitor's view travels along; identities are the caller's.
    assert (ev1.section, ev1.steps, ev1.last_heartbeat_age, ev1.expired, ev1.kind) == ("step", 7, 3.5, True, "section")
    assert (ev0.section, ev0.expired, ev0.node, ev0.group_rank, ev0.rank) == (None, False, "n1", 0, 0)
    assert ev0.last_heartbeat_age == 2.0  # a zero-code rank's beat is its optimizer step: the youngest sign counts
    assert ev0.stacks_path and Path(ev0.stacks_path).exists()


@pytest.mark.processes
@pytest.mark.skipif(find_py_spy() is None, reason="py-spy is not installed")
def test_stopped_rank_reads_stopped_and_the_bound_holds(job, tmp_path):
    workers = job("sleep")
    os.kill(workers[1].pid, signal.SIGSTOP)
    _wait_stopped(workers[1].pid)
    ev0, ev1 = _gather(workers, tmp_path, "py-spy")
    _check_waiting_rank_0(ev0)
    # The state is read before anything touches the rank; its CPU share is measured over the dumps, and
    # py-spy's attach (ptrace) lets a stopped process run for the moment it takes: next to nothing.
    assert ev1.state is ProcState.STOPPED and ev1.cpu is not None and ev1.cpu < 0.5, ev1
    assert ev1.progress == ()  # a stopped process dumps nothing
    assert _default_group(ev0).enqueued >= 4


@pytest.mark.processes
def test_busy_rank_is_running_outside_any_collective(job, tmp_path):
    ev0, ev1 = _gather(job("busy"), tmp_path)
    _check_waiting_rank_0(ev0)
    assert ev1.state is ProcState.RUNNING and ev1.cpu is not None and ev1.cpu > 0.02, ev1  # a sleeping rank reads 0; a busy one on 2 cores at load 10 read 0.17
    assert ev1.stack is StackClass.OUTSIDE and ev1.where.startswith("hang_busy at train.py"), ev1
    # It still dumps: the shim's thread gets the GIL at the interpreter's switch interval.
    assert _default_group(ev0).enqueued == _default_group(ev1).enqueued + 1


@pytest.mark.processes
def test_gone_ranks_and_ranks_without_a_reader(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert evidence.sample([proc.pid], window=0.05) == {proc.pid: (ProcState.GONE, None)}
    fifo = tmp_path / "t.fifo"
    flightrec.make_trigger(fifo)
    flightrec.make_trigger(fifo)  # idempotent
    assert flightrec.trigger(fifo) is False  # nobody reads: no blocking, no request
    assert flightrec.trigger(tmp_path / "missing", None) is False
    plain = tmp_path / "plain"
    plain.write_text("x")
    assert flightrec.trigger(plain) is False and plain.read_text() == "x"


@pytest.mark.processes
@pytest.mark.parametrize("ages, freshest", [
    ((float("nan"), 4.0), 4.0),  # min() of [nan, 4.0] is nan: the rank would read as never heard of
    ((3.0, float("inf")), 3.0),
    ((float("inf"), None), None),
    ((-float("inf"), float("nan")), None),
])
def test_a_nan_or_infinite_age_in_the_monitors_row_is_no_sign_of_life(tmp_path, ages, freshest):
    """The monitor's rows are JSON from another process, which carries NaN and Infinity; the evidence keeps the
    youngest finite age, or none."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    spec = WorkerSpec(local_rank=0, rank=0, argv=[], env={}, stdout=None, stderr=None)
    gone = Worker(spec=spec, proc=proc, pidfd=-1, started=0.0, status=ExitStatus.from_returncode(0))
    [ev] = gather([gone], node="n1", group_rank=0, out_dir=tmp_path, stack_method="off", bound=0.5,
                  monitor_rows=[{"local_rank": 0, "last_heartbeat_age": ages[0], "last_step_age": ages[1],
                                 "steps": True}])
    assert ev.state is ProcState.GONE
    assert ev.last_heartbeat_age == freshest
    assert ev.steps is None  # a bool is no step count


class _Evil:
    def __reduce__(self):
        return (os.system, (f"touch {_Evil.marker}",))


@pytest.mark.parametrize("payload", [
    b"", b"garbage\x00\xff", pickle.dumps({"pg_status": {"0": {}}})[:-5], pickle.dumps([1, 2, 3]),
    pickle.dumps({"pg_status": [1]}), pickle.dumps({"pg_status": {"0": "x"}, "entries": "y"}),
    b"\x80\x04\x95" + b"\xff" * 8,
])
def test_garbage_dumps_give_no_progress(tmp_path, payload):
    path = tmp_path / "dump"
    path.write_bytes(payload)
    assert read_dump(path) == ()


def test_hostile_dumps_run_no_code(tmp_path):
    _Evil.marker = tmp_path / "pwned"
    path = tmp_path / "dump"
    path.write_bytes(pickle.dumps({"pg_status": {"0": {"last_enqueued_collective": 1}}, "x": _Evil()}))
    assert read_dump(path) == ()
    path.write_bytes(pickle.dumps(GroupProgress("0", 1, 1, 1)))  # any class, even ours, is refused
    assert read_dump(path) == ()
    assert not _Evil.marker.exists()
    assert read_dump(tmp_path / "missing") == ()


def test_progress_of_an_nccl_style_dump():
    dump = {"version": "2.10", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"}},
            "pg_status": {"0": {"last_enqueued_collective": 183, "last_started_collective": 183,
                                "last_completed_collective": 182}},
            "entries": [{"pg_id": 0, "process_group": ("0", "default_pg"), "collective_seq_id": s,
                         "profiling_name": name, "is_p2p": False}
                        for s, name in ((183, "nccl:all_reduce"), (182, "nccl:broadcast"))]
            + [{"pg_id": 0, "collective_seq_id": 0, "profiling_name": "nccl:send 0->1", "is_p2p": True}]}
    assert flightrec.progress(dump) == (GroupProgress("0", 183, 183, 182, (0, 1, 2, 3), "all_reduce"),)
    # An NCCL recorder that never ran a group gives way to gloo's view of it.
    idle, used = GroupProgress("0", -1, -1, -1), GroupProgress("0", 4, -1, 4, (), "all_reduce")
    assert flightrec.merge([(idle,), (used,)]) == (used,)


def test_flight_env_leaves_the_users_settings_alone(tmp_path):
    env = flightrec.flight_env(tmp_path, {})
    assert env["TORCH_FR_BUFFER_SIZE"] == "2000" and env["TORCH_INCLUDE_STACK_TRACE"] == "0"
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == env["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] == str(tmp_path / "nccl_fr.")
    assert env[FR_TRIGGER_ENV] == str(tmp_path / "fr.trigger") and env[FR_FILE_ENV] == str(tmp_path / "fr.pickle")
    user = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "50", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/x/t",
            "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": "/x/p", "TORCH_INCLUDE_STACK_TRACE": "1"}
    assert set(flightrec.flight_env(tmp_path, user)) == {FR_TRIGGER_ENV, FR_FILE_ENV}
    files = flightrec.dump_files({**user, FR_FILE_ENV: "/r/fr.pickle"}, 3)
    assert files.all() == (Path("/r/fr.pickle.nccl"), Path("/x/t3"), Path("/r/fr.pickle"))
    assert flightrec.nccl_pipe(user, 3) == Path("/x/p3.pipe")
    # Per-attempt paths do not make a warm standby (started before them) unusable: torch reads them late.
    assert mismatched_keys({"A": "1"}, {"A": "1", **flightrec.flight_env(tmp_path, {})}) == []


# A started thread counts in _thread._count() only once it runs: on a loaded machine, wait for it a moment.
SHIM_PROBE = ("import sys, _thread, time\n"
              "armed = 'mbr_launch.shim.flight' in sys.modules\n"
              "t = time.monotonic()\n"
              "while armed and _thread._count() < 1 and time.monotonic() - t < 10:\n"
              "    time.sleep(0.01)\n"
              "print(armed, _thread._count())\n")


@pytest.mark.processes
def test_flight_thread_costs_nothing_unless_asked(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(SHIM_PROBE)
    env = {k: v for k, v in os.environ.items() if k not in (FR_TRIGGER_ENV, FR_FILE_ENV)}
    env["PYTHONPATH"] = str(REPO)
    run = [sys.executable, "-m", "mbr_launch.shim.boot", str(script)]
    out = subprocess.run(run, env=env, capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["False", "0"]
    fifo = tmp_path / "fr.trigger"
    flightrec.make_trigger(fifo)
    env.update({FR_TRIGGER_ENV: str(fifo), FR_FILE_ENV: str(tmp_path / "fr.pickle")})
    out = subprocess.run(run, env=env, capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["True", "1"]
    # Arming is a FIFO open and a thread start; a worker without torch.distributed dumps nothing.
    code = ("import time, sys; t = time.perf_counter(); from mbr_launch.shim import flight; ok = flight.arm(); "
            "print(ok, (time.perf_counter() - t) * 1e3, flight.dump(sys.argv[1]))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "x")], env=env, capture_output=True,
                         text=True, timeout=60, check=True)
    ok, ms, dumped = out.stdout.split()
    assert ok == "True" and dumped == "False", out.stdout  # its cost (about 1 ms) is a benchmark's to say, not a test's


def _wait_stopped(pid: int) -> None:
    deadline = time.monotonic() + 5
    while evidence.read_stat(pid)[0] is not ProcState.STOPPED:
        assert time.monotonic() < deadline, f"{pid} never stopped"
        time.sleep(0.01)


# ---- classify() on canned dumps ----------------------------------------------------------------------------

C10D = "/v/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
LOGGER = "/v/lib/python3.11/site-packages/torch/distributed/c10d_logger.py"
CUDA = "/v/lib/python3.11/site-packages/torch/cuda/__init__.py"
LOADER = "/v/lib/python3.11/site-packages/torch/utils/data/dataloader.py"
RUNPY = "<frozen runpy>"
IPR_WRAP = "/v/lib/python3.11/site-packages/nvidia_resiliency_ext/inprocess/wrap.py"
IPR_STORE = "/v/lib/python3.11/site-packages/nvidia_resiliency_ext/inprocess/store.py"
IPR_ABORT = "/v/lib/python3.11/site-packages/nvidia_resiliency_ext/inprocess/abort.py"


def _py_spy(*frames: tuple[str, str, int]) -> str:
    lines = ["Process 7: python train.py", "Python v3.11.7 (/usr/bin/python3.11)", "",
             'Thread 8 (idle): "loader"', "    worker (/x/loader.py:3)",
             'Thread 7 (idle): "MainThread"']
    lines += [f"    {fn} ({file}:{line})" for fn, file, line in frames]
    return "\n".join(lines) + "\n"


def _faulthandler(*frames: tuple[str, str, int]) -> str:
    # The shim's Flight Recorder thread (started with _thread, no threading frame) is listed first.
    lines = ["Thread 0x00007f0000000003 (most recent call first):",
             '  File "/r/mbr_launch/shim/flight.py", line 52 in _serve', "",
             "Current thread 0x00007f0000000002 (most recent call first):"]
    lines += [f'  File "{file}", line {line} in {fn}' for fn, file, line in frames]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("fmt", [_py_spy, _faulthandler])
def test_classify_canned_stacks(tmp_path, fmt):
    train = tmp_path / "train.py"
    train.write_text("import x\nwork.wait()\nstore.get('k')\nos.wait()\ntime.sleep(9)\n")
    tr = str(train)
    method = "py-spy" if fmt is _py_spy else "faulthandler"
    cases = [
        ([("all_reduce", C10D, 3252), ("_exception_logger.<locals>.wrapper", LOGGER, 83), ("step", tr, 1),
          ("<module>", RUNPY, 88)], StackClass.COLLECTIVE, "all_reduce", "step at train.py:1"),
        ([("barrier", C10D, 4000), ("wrapper", LOGGER, 83), ("<module>", tr, 1)],
         StackClass.COLLECTIVE, "barrier", "<module> at train.py:1"),
        ([("synchronize", CUDA, 1040), ("step", tr, 1)], StackClass.COLLECTIVE, "cuda.synchronize", "step"),
        ([("step", tr, 2)], StackClass.COLLECTIVE, "wait", "step at train.py:2: work.wait()"),
        ([("step", tr, 3)], StackClass.COLLECTIVE, "store", "step at train.py:3"),
        ([("step", tr, 4)], StackClass.OUTSIDE, "", "step at train.py:4: os.wait()"),
        ([("hang", tr, 5), ("<module>", tr, 1)], StackClass.OUTSIDE, "", "hang at train.py:5: time.sleep(9)"),
        ([("wait", "/usr/lib/python3.11/threading.py", 320), ("_next_data", LOADER, 1300),
          ("__next__", LOADER, 700), ("<module>", tr, 1)], StackClass.OUTSIDE, "", "(in wait)"),
        # A collective far below user code is not where the thread waits.
        ([("hang", tr, 5), ("all_reduce", C10D, 3252)], StackClass.OUTSIDE, "", "hang at train.py:5"),
        # NVRx's in-process Wrapper between runs of the wrapped function: its restart (the barrier waits on a
        # store, torch's abort under it) ...
        ([("StoreMixin.reentrant_barrier", IPR_STORE, 295), ("CallWrapper.__call__", IPR_WRAP, 534),
          ("inner", "/usr/lib/python3.11/contextlib.py", 81), ("wrapped", IPR_WRAP, 241), ("main", tr, 1)],
         StackClass.RESTARTING, "in-process restart", "reentrant_barrier"),
        ([("destroy_process_group", C10D, 2000), ("AbortTorchDistributed.__call__", IPR_ABORT, 60),
          ("CallWrapper.__call__", IPR_WRAP, 530), ("main", tr, 1)], StackClass.RESTARTING, "in-process restart", ""),
        # ... but while the wrapped function runs, the script's frame is the innermost one outside torch.
        ([("all_reduce", C10D, 3252), ("train", tr, 1), ("CallWrapper.__call__", IPR_WRAP, 534), ("main", tr, 1)],
         StackClass.COLLECTIVE, "all_reduce", "train at train.py:1"),
        ([("hang", tr, 5), ("CallWrapper.__call__", IPR_WRAP, 534)], StackClass.OUTSIDE, "", "hang at train.py:5"),
    ]
    for frames, cls, op, where in cases:
        got = classify(fmt(*frames), method)
        assert got[0] is cls and got[2] == op and where in got[1], (frames, got)
    assert classify("nothing here", method) == (StackClass.NONE, "", "")
