"""GPU memory between rounds and at launch, with NVML faked at its one module's boundary (``health.nvml``:
an object with ``memory`` and ``close`` that answers as scripted) and everything above it real: whose each
process is (``health.gpuowners``, against scripted process tables and against this machine's /proc with real
processes), the reclaim wait's rule (``health.gpumem``, injected clock), and the doctor's ``gpu.strangers``
check and the preflight line that names them."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import replace

import pytest

from mbr_launch.doctor import run_checks
from mbr_launch.doctor.context import DoctorContext
from mbr_launch.doctor.probes import NvmlView
from mbr_launch.doctor.report import preflight_line
from mbr_launch.health import gpumem, gpuowners, nvml
from mbr_launch.health.gpuowners import Job, Owner, Reading, ProcInfo
from mbr_launch.health.nvml import GpuMemory, GpuProcess
from mbr_launch.workers.strays import Proc
from testkit.clocks import Clock

pytestmark = pytest.mark.timeout(30)

ME = 100
TABLE = {ME: Proc(1, ME, False), 101: Proc(ME, 101, False), 102: Proc(101, 101, False), 300: Proc(1, 300, False),
         301: Proc(1, 301, False)}
SEEN = {ME: ProcInfo("ann", "mbr-launch train.py"), 101: ProcInfo("ann", "python -u train.py"),
        102: ProcInfo("ann", "python dataloader"), 300: ProcInfo("bob", "python spin.py"),
        301: ProcInfo("ann", "python -u train.py", (b"TORCHELASTIC_RUN_ID=job7",))}


def gpu(device: str, used: float | None, *procs: tuple[int, float | None], total: float = 81920.0,
        listed: bool = True) -> GpuMemory:
    return GpuMemory(device, used, total, tuple(GpuProcess(p, mb) for p, mb in procs) if listed else None)


def scripted(job: Job, *polls: list[GpuMemory]):
    """A reading per call from the scripted NVML answers (the last one again when they run out)."""
    history = list(polls)

    def read() -> Reading:
        memories = history.pop(0) if len(history) > 1 else history[0]
        return gpuowners.classify(memories, job, TABLE, SEEN.get)
    return read


def wait(read, clock: Clock, *, timeout: float = 50, sleep=None) -> gpumem.Reclaim:
    return gpumem.wait_reclaimed(read, timeout=timeout, tolerance_mb=512, poll_interval=2, clock=clock,
                                 sleep=sleep or clock.sleep)


# ---- whose is the memory -----------------------------------------------------------------------------------

def test_each_process_on_the_gpus_is_the_jobs_or_a_strangers():
    job = Job(me=ME, run_id="job7", ended=frozenset({555}), present_before=frozenset({900}))
    reading = gpuowners.classify([gpu("0", 90000, (555, 80000), (102, 500), (300, 2383), (301, 700), (900, 100),
                                      (901, 50))], job, TABLE, SEEN.get)
    owners = {h.pid: h.owner for h in reading.holders}
    assert owners == {555: Owner.ENDED,  # a stopped worker: waited for
                      102: Owner.JOB,  # a descendant of the launcher, running
                      300: Owner.STRANGER,  # another user's, outside the launcher's tree
                      301: Owner.JOB,  # carries this run's id (a worker of another agent of the job)
                      900: Owner.STRANGER,  # not seen here, but on the GPU before the round: not ours
                      901: Owner.ENDED}  # not seen here and new this round: as far as can be told, ours
    bob = next(h for h in reading.holders if h.pid == 300)
    assert bob.describe() == "pid 300 (user bob, `python spin.py`; not of this job) holds 2383 MB on GPU 0"
    assert bob.to_event() == {"gpu": "0", "pid": 300, "mb": 2383, "owner": "stranger", "user": "bob",
                              "command": "python spin.py"}
    ended = next(h for h in reading.holders if h.pid == 555)
    assert ended.describe() == "pid 555 (this job's, ended) holds 80000 MB on GPU 0"
    unseen = next(h for h in reading.holders if h.pid == 900)
    assert "not visible from here" in unseen.describe() and "not of this job" in unseen.describe()


def test_a_stopped_workers_pid_is_not_looked_up_again():
    looked: list[int] = []
    gpuowners.classify([gpu("0", 1000, (101, 900))], Job(me=ME, ended=frozenset({101})), TABLE,
                       lambda pid: looked.append(pid) or SEEN.get(pid))
    assert looked == []  # reaped: whatever now has its pid is another process


# ---- the reclaim wait --------------------------------------------------------------------------------------

def test_the_wait_ends_the_moment_the_jobs_ended_processes_are_gone_whatever_strangers_hold():
    clock = Clock()
    job = Job(me=ME, ended=frozenset({555}))
    got = wait(scripted(job, [gpu("0", 82000, (555, 79000), (300, 2383))], [gpu("0", 82000, (555, 79000), (300, 2383))],
                        [gpu("0", 3000, (300, 2383))]), clock)
    assert got.reclaimed and got.polls == 3 and clock.slept == [0.05, 0.1]
    assert got.last.memories[0].used_mb == 3000  # far above the 512 MB tolerance: ft_launcher would wait on
    assert [h.pid for h in got.last.of(Owner.STRANGER)] == [300] and got.holding() == []


def test_running_processes_of_the_job_do_not_hold_the_wait():
    got = wait(scripted(Job(me=ME, ended=frozenset({555})), [gpu("0", 1500, (101, 1000), (301, 500))]), Clock())
    assert got.reclaimed and got.polls == 1


def test_at_the_timeout_it_names_what_still_holds_the_memory_and_whose():
    clock = Clock()
    got = wait(scripted(Job(me=ME, ended=frozenset({555})), [gpu("0", 82000, (555, 79000), (300, 2383)),
                                                             gpu("1", 9000, listed=False)]), clock, timeout=5)
    assert not got.reclaimed and not got.interrupted and got.seconds == 5
    # backs off towards the poll interval; the last poll falls on the deadline
    assert clock.slept[:6] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.6] and clock.slept[6] == pytest.approx(1.85)
    assert [h.describe() for h in got.holding()] == ["pid 555 (this job's, ended) holds 79000 MB on GPU 0"]
    assert [m.device for m in got.over()] == ["1"]  # no per-process view: ft_launcher's rule


def test_a_gpu_without_a_per_process_view_waits_for_the_tolerance_and_an_unreadable_one_not_at_all():
    clock = Clock()
    got = wait(scripted(Job(me=ME), [gpu("0", 9000, listed=False), gpu("1", None, listed=False)],
                        [gpu("0", 400, listed=False), gpu("1", None, listed=False)]), clock)
    assert got.reclaimed and got.polls == 2


def test_a_signal_ends_the_wait():
    got = wait(scripted(Job(me=ME, ended=frozenset({555})), [gpu("0", 9000, (555, 8000))]), Clock(),
               sleep=lambda s: False)
    assert not got.reclaimed and got.interrupted and got.polls == 1


def test_what_the_job_used_and_whether_strangers_leave_enough_for_the_next_round():
    job = Job(me=ME, ended=frozenset({555}))
    reading = gpuowners.classify([gpu("0", 81000, (555, 20000), (300, 60000), total=81920),
                                  gpu("1", 20000, (556, 19000), total=81920)], job, TABLE, SEEN.get)
    assert gpumem.held_by_job(reading, [555, 556]) == {"0": 20000, "1": 19000}
    # GPU 0: 920 MB free now, 20920 once the ended worker's memory is back; the job used 30000 there
    [(memory, free, need)] = gpumem.short_of(reading, {"0": 30000.0})
    assert (memory.device, free, need) == ("0", 20920, 30000)
    assert gpumem.short_of(reading, {"0": 20000.0}) == []  # enough
    assert gpumem.short_of(reading, {}) == []  # not known: no judgement
    # a GPU the job's use was not seen on is judged by the most any GPU needed; GPU 1 has no stranger
    assert [m.device for m, _, _ in gpumem.short_of(reading, {"1": 25000.0})] == ["0"]


# ---- at launch: the doctor's gpu.strangers -----------------------------------------------------------------

def doctor(memories, *, owners=None, nproc: str = "1", env=None) -> DoctorContext:
    return DoctorContext.from_values(env=env or {}, nproc_per_node=nproc, run_id="job7",
                                     nvml=lambda: NvmlView(True, driver="570", gpus=()),
                                     gpu_memory=lambda devices: memories(devices) if callable(memories) else memories,
                                     # the scripted table's launcher is ME, this process is not in it
                                     gpu_owners=owners or (lambda m, job: gpuowners.classify(
                                         m, replace(job, me=ME), TABLE, SEEN.get)))


def strangers(ctx: DoctorContext):
    return next(r for r in run_checks(ctx, only_cheap=True) if r.id == "gpu.strangers")


def test_the_doctor_names_strangers_on_the_jobs_gpus_and_the_preflight_prints_them_in_full():
    asked: list[list[str]] = []

    def memories(devices):
        asked.append(list(devices))
        return [gpu("3", 5000, (300, 2383), (101, 1000))]

    r = strangers(doctor(memories, env={"CUDA_VISIBLE_DEVICES": "3,4"}))
    assert asked == [["3"]]  # --nproc-per-node 1: the first visible GPU
    assert r.severity == "warn" and r.named
    assert r.saw == "pid 300 (user bob, `python spin.py`; not of this job) holds 2383 MB on GPU 3"
    line = preflight_line([r])
    assert line is not None and line.startswith("WARNING: gpu.strangers: pid 300 (user bob, `python spin.py`")


def test_the_doctor_is_quiet_about_the_launchers_own_processes_and_says_why_it_cannot_look():
    assert strangers(doctor([gpu("0", 900, (101, 800))])).severity == "ok"
    assert strangers(doctor("nvidia-ml-py is not installed")).saw == "no GPU (nvidia-ml-py is not installed)"
    assert strangers(doctor([gpu("0", 900, listed=False)])).severity == "skip"
    assert strangers(doctor([], nproc="cpu")).severity == "ok"


def test_before_the_first_round_a_process_not_seen_here_is_a_stranger():
    r = strangers(doctor([gpu("0", 900, (77777, 800))]))
    assert r.severity == "warn" and "pid 77777 (not visible from here" in r.saw and "not of this job" in r.saw


# ---- against this machine's /proc, with real processes ------------------------------------------------------

def _detached(*argv: str, env: dict[str, str] | None = None) -> int:
    """A real process that does not descend from this one: its shell parent exits at once."""
    quoted = " ".join(argv)
    out = subprocess.run(["sh", "-c", f"{quoted} >/dev/null 2>&1 & echo $!"], capture_output=True, text=True,
                         timeout=10, start_new_session=True, env=env)
    return int(out.stdout.strip())


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.02)  # its new parent reaps it


@pytest.mark.processes
def test_real_processes_a_stranger_named_with_user_and_command_a_child_and_one_of_the_run_are_the_jobs():
    stranger = _detached("sleep", "61")
    of_run = _detached("sleep", "62", env={**os.environ, "TORCHELASTIC_RUN_ID": "job7"})
    child = subprocess.Popen(["sleep", "63"])
    try:
        memories = [gpu("0", 9000, (stranger, 2383), (of_run, 1000), (child.pid, 4000))]
        ctx = DoctorContext.from_values(env={}, nproc_per_node="1", run_id="job7",
                                        nvml=lambda: NvmlView(True, driver="570", gpus=()),
                                        gpu_memory=lambda devices: memories)
        r = strangers(ctx)  # the real /proc reader (probes.gpu_owners)
        user = __import__("pwd").getpwuid(os.getuid()).pw_name
        assert r.severity == "warn"
        assert r.saw == f"pid {stranger} (user {user}, `sleep 61`; not of this job) holds 2383 MB on GPU 0", r.saw
    finally:
        child.kill()
        child.wait()
        _kill(stranger)
        _kill(of_run)


def test_the_doctors_nvml_questions_each_open_one_session_and_close_it(monkeypatch):
    """``health.nvml.once``: where the doctor opens NVML (its GPU view, its memory reading), one session per
    question, closed after it even when the question fails; without NVML, the reason is the answer."""
    opened: list[FakeSession] = []

    class FakeSession:
        def __init__(self) -> None:
            self.closed = False
            opened.append(self)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.close()

        def close(self) -> None:
            self.closed = True

        def memory(self, device: str) -> GpuMemory:
            return gpu(device, 10.0)

        def driver(self) -> str:
            return "570"

        def count(self) -> int:
            raise RuntimeError("NVML_ERROR_GPU_IS_LOST")

    monkeypatch.setattr(nvml.Nvml, "open", classmethod(lambda cls: FakeSession()))
    assert nvml.memories(["0", "1"]) == [gpu("0", 10.0), gpu("1", 10.0)]
    view = nvml.view()
    assert not view.available and view.reason == "NVML query failed: NVML_ERROR_GPU_IS_LOST"
    assert len(opened) == 2 and all(s.closed for s in opened)
    monkeypatch.setattr(nvml.Nvml, "open", classmethod(lambda cls: "nvidia-ml-py is not installed"))
    assert nvml.memories(["0"]) == "nvidia-ml-py is not installed"
    assert nvml.view() == NvmlView(available=False, reason="nvidia-ml-py is not installed")
    assert DoctorContext().gpu_memory(["0"]) == "nvidia-ml-py is not installed"  # the doctor asks through it
