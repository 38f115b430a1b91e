"""The worker-side step hook (``mbr_launch.shim.autobeat``) and the monitor's step deadlines."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from typing import Iterator
from pathlib import Path

import pytest

from mbr_launch.contract import WORK
from mbr_launch.monitor.steps import BEAT, CHECKPOINT, FINISHED, FIRST, StepWatch

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(120)


def _python(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONWARNINGS": "ignore", **(env or {})}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=90, env=full, cwd=REPO)


@pytest.fixture
def beat_socket():
    directory = tempfile.mkdtemp(prefix="mbr-test-")
    path = os.path.join(directory, "steps0.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(10)
    yield path, sock
    sock.close()
    os.unlink(path)
    os.rmdir(directory)


@pytest.mark.processes
def test_install_does_not_import_torch_and_hooks_the_first_optimizer(beat_socket):
    path, sock = beat_socket
    res = _python("""
        import sys
        from mbr_launch.shim import autobeat
        assert autobeat.install()
        assert not any(m == "torch" or m.startswith("torch.") for m in sys.modules), "install imported torch"
        assert "mbr_launch.shim.autobeat.torchhooks" not in sys.modules  # loaded with torch, not before
        assert not autobeat.installed()
        import torch
        import torch.distributed as dist
        assert autobeat.installed(), "hook not registered by import torch"
        assert getattr(dist.destroy_process_group, "__mbr_autobeat__", False)
        assert getattr(dist.all_reduce, "__mbr_autobeat__", False)
        assert dist.all_reduce is dist.distributed_c10d.all_reduce
        # the finder stays only for what import torch does not import: DCP, torch.compile's collective remaps
        assert [f.waiting for f in sys.meta_path if type(f).__name__ == "_Finder"] == [{
            autobeat.DCP, autobeat.FUNCTIONAL, *autobeat.CHECKPOINTERS}]
        m = torch.nn.Linear(4, 4)
        a, b = torch.optim.SGD(m.parameters(), lr=0.1), torch.optim.SGD(m.parameters(), lr=0.1)
        for _ in range(3):
            m(torch.randn(2, 4)).sum().backward()
            a.step()
            b.step()  # a second optimizer: not a second training step
        print("ok")
    """, {"MBR_AUTOBEAT_SOCKET": path})
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr
    beats = [BEAT.unpack(sock.recv(64)) for _ in range(4)]
    assert [b[0] for b in beats[:3]] == [1, 2, 3]
    assert beats[0][3] == FIRST and beats[1][3] == 0 and beats[2][3] == 0
    assert all(0 < b[1] < 5 and b[2] >= 0 for b in beats[1:3])
    assert beats[3][3] == FINISHED  # at exit
    sock.settimeout(0.2)
    with pytest.raises(socket.timeout):
        sock.recv(64)


@pytest.mark.processes
def test_boot_without_autobeat_leaves_no_hook(tmp_path, beat_socket):
    path, _sock = beat_socket
    script = tmp_path / "s.py"
    script.write_text("import sys, torch\nfrom mbr_launch.shim import autobeat\n"
                      "print('hooked' if autobeat.installed() else 'clean', "
                      "[sorted(f.waiting) for f in sys.meta_path if type(f).__name__ == '_Finder'])\n")
    from mbr_launch.shim import autobeat

    waiting = str([sorted({autobeat.FUNCTIONAL, autobeat.DCP, *autobeat.CHECKPOINTERS})])
    for flag, expected in (("0", "clean []"), ("1", f"hooked {waiting}")):
        res = subprocess.run([sys.executable, "-m", "mbr_launch.shim.boot", str(script)], capture_output=True, text=True,
                             timeout=90, cwd=REPO, env={**os.environ, "PYTHONWARNINGS": "ignore",
                                                         "MBR_AUTOBEAT": flag, "MBR_AUTOBEAT_SOCKET": path})
        assert res.stdout.strip() == expected, res.stderr


def test_autobeat_off_sets_no_worker_environment():
    from mbr_launch.api import build_launch_config

    script = str(REPO / "tests" / "scripts" / "plain_sgd.py")
    off = build_launch_config(cli={"autobeat": "off", "standalone": True, "skip_check": "all"}, script=script,
                              script_args=(), environ={})
    assert off.telemetry.autobeat is False
    on = build_launch_config(cli={"standalone": True, "skip_check": "all"}, script=script, script_args=(),
                             environ={})
    assert on.telemetry.autobeat is True and on.telemetry.step_timeout == 1800.0
    assert on.telemetry.initial_step_timeout == 3600.0 and on.telemetry.straggler_threshold == 0.7


# ---- StepWatch: pure deadlines ----------------------------------------------------------------------------


def test_step_deadlines_initial_then_subsequent():
    w = StepWatch(initial=60.0, subsequent=2.0)
    w.arm(100.0)
    assert w.deadline == 160.0
    assert w.expiry(159.9) is None and w.expiry(160.0) == (60.0, 60.0)
    assert w.beat(110.0, 1, 9.0, 8.0, FIRST) is True
    assert w.deadline == 112.0 and w.pending == []  # the first step's period is start-up, not a step
    assert w.beat(111.0, 2, 1.0, 0.5, 0) is False
    assert w.expiry(113.5) == (2.0, pytest.approx(2.5))
    w.expire()
    assert w.expiry(1000.0) is None  # one expiry per arm
    report = w.take_report()
    assert report is not None and report["periods"] == [1.0] and report["cpu"] == [0.5] and report["steps"] == 2
    assert w.take_report() is None


def test_beats_dropped_by_a_full_queue_still_count_as_steps():
    """The worker numbers its steps: a monitor that lost beats 2-4 (its queue was full) still counts 5 steps."""
    w = StepWatch(initial=60.0, subsequent=2.0)
    w.arm(0.0)
    w.beat(1.0, 1, 1.0, 1.0, FIRST)
    w.beat(2.0, 5, 0.2, 0.1, 0)
    w.beat(2.1, 6, 0.1, 0.1, 0)
    report = w.take_report()
    assert report is not None and report["steps"] == 6 and report["index"] == 6 and report["periods"] == [0.2, 0.1]


def test_finished_stops_the_clock_until_the_next_step():
    w = StepWatch(initial=None, subsequent=2.0)
    w.arm(0.0)
    assert w.deadline is None
    w.beat(1.0, 1, 1.0, 1.0, FIRST)
    w.beat(2.0, 1, 0.0, 0.0, FINISHED)
    assert w.deadline is None and w.steps == 1
    w.beat(50.0, 2, 48.0, 1.0, 0)
    assert w.deadline == 52.0


def test_an_nvrx_client_takes_over_the_deadlines():
    w = StepWatch(initial=60.0, subsequent=2.0)
    w.arm(0.0)
    w.yield_to_client()
    w.beat(1.0, 1, 1.0, 1.0, FIRST)
    w.beat(2.0, 2, 1.0, 1.0, 0)
    assert w.deadline is None and w.expiry(1e6) is None
    assert w.take_report()["periods"] == [1.0]  # still recorded for stragglers and goodput


# ---- the monitor process --------------------------------------------------------------------------------


class MonitorProc:
    """A real rank monitor driven like the agent drives it; as a context manager it owns a temporary folder for
    its sockets and removes it, after ``close``, on the way out."""

    def __init__(self, directory: str, steps: dict) -> None:
        self.directory = directory
        self.proc = subprocess.Popen([sys.executable, "-m", "mbr_launch.monitor.server"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, cwd=REPO)
        self._pending = b""
        self.send({"op": "configure", "dir": directory, "cfg": {"initial_rank_heartbeat_timeout": 30,
                                                                 "rank_heartbeat_timeout": 30}, "steps": steps})
        assert self.wait("ready")

    def send(self, msg: dict) -> None:
        assert self.proc.stdin
        self.proc.stdin.write((json.dumps(msg) + "\n").encode())
        self.proc.stdin.flush()

    def wait(self, name: str, timeout: float = 10.0) -> dict:
        import select

        assert self.proc.stdout
        fd = self.proc.stdout.fileno()  # read unbuffered: select cannot see lines a file object has buffered
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            while b"\n" in self._pending:
                line, self._pending = self._pending.split(b"\n", 1)
                event = json.loads(line)
                if event.get("ev") == name:
                    return event
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            data = os.read(fd, 1 << 16)
            if not data:
                break
            self._pending += data
        raise AssertionError(f"no {name} event within {timeout} s")

    def close(self) -> None:
        self.send({"op": "exit"})
        self.proc.wait(10)

    @classmethod
    @contextlib.contextmanager
    def running(cls, steps: dict) -> Iterator["MonitorProc"]:
        with tempfile.TemporaryDirectory(prefix="mbr-test-") as directory:
            mon = cls(directory, steps)
            try:
                yield mon
            finally:
                mon.close()

    def arm(self, rank: int) -> tuple[str, str]:
        """Arm local rank 0 as ``rank``; (its step socket, its NVRx client socket)."""
        steps, rmon = os.path.join(self.directory, "steps0.sock"), os.path.join(self.directory, "rmon0.sock")
        self.send({"op": "arm", "local_rank": 0, "rank": rank, "socket": rmon, "step_socket": steps})
        self.wait("armed")
        return steps, rmon


@contextlib.contextmanager
def armed_monitor(steps: dict, rank: int) -> Iterator[tuple[MonitorProc, socket.socket]]:
    """A real monitor with local rank 0 armed as ``rank`` on a step socket, and a client of that socket."""
    with MonitorProc.running(steps) as mon, socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as client:
        client.connect(mon.arm(rank)[0])
        yield mon, client


@pytest.mark.processes
def test_monitor_expires_a_silent_rank_and_reports_step_times():
    with armed_monitor({"initial": 30, "subsequent": 0.5, "report_interval": 0.2}, rank=3) as (mon, client):
        client.send(BEAT.pack(1, 5.0, 4.0, FIRST))
        first = mon.wait("first_step")
        assert (first["local_rank"], first["rank"]) == (0, 3)
        for i in range(2, 5):
            client.send(BEAT.pack(i, 0.01 * i, 0.005 * i, 0))
        steps = mon.wait("steps")
        (entry,) = steps["ranks"]
        assert entry["periods"] == pytest.approx([0.02, 0.03, 0.04]) and entry["steps"] == 4
        assert entry["nvrx_client"] is False
        t0 = time.monotonic()
        expired = mon.wait("expired")
        assert expired["kind"] == "step" and expired["rank"] == 3 and expired["step"] == 4
        assert 0.5 <= expired["elapsed"] < 0.5 + 0.5 and time.monotonic() - t0 < 1.5


@pytest.mark.processes
def test_a_snapshot_counts_the_beats_queued_before_it():
    """The monitor reads commands before step sockets: a snapshot asked while beats wait unread (the monitor was
    starved, here stopped) must still count them (the agent's catch-up at a failure reads steps this way)."""
    with armed_monitor({"initial": 30, "subsequent": 30, "report_interval": 30}, rank=0) as (mon, client):
        os.kill(mon.proc.pid, signal.SIGSTOP)
        try:
            client.send(BEAT.pack(1, 5.0, 4.0, FIRST))
            for i in range(2, 9):  # 8 beats: within the kernel's default queue of 10 datagrams
                client.send(BEAT.pack(i, 0.01, 0.005, 0))
            mon.send({"op": "snapshot"})  # in the same wake-up as the beats
        finally:
            os.kill(mon.proc.pid, signal.SIGCONT)
        (row,) = mon.wait("snapshot")["ranks"]
        assert (row["steps"], row["step"]) == (8, 8), row


@pytest.mark.processes
def test_no_double_heartbeats_with_the_nvrx_client(tmp_path):
    """A script using RankMonitorClient owns its liveness: step beats no longer expire, NVRx timeouts do."""
    with MonitorProc.running({"initial": 30, "subsequent": 0.5, "report_interval": 0.2}) as mon:
        _nvrx_client_owns_liveness(mon)


def _nvrx_client_owns_liveness(mon: MonitorProc) -> None:
    """The worker under a real NVRx client; killed on the way out."""
    worker = None
    try:
        path, rmon = mon.arm(rank=0)
        worker = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
            from mbr_launch.shim import autobeat
            assert autobeat.install()  # what the boot shim does under the launcher
            import time, torch
            from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient
            c = RankMonitorClient()
            c.init_workload_monitoring()
            m = torch.nn.Linear(2, 2); opt = torch.optim.SGD(m.parameters(), lr=0.1)
            for _ in range(3):
                m(torch.ones(1, 2)).sum().backward(); opt.step(); c.send_heartbeat()
            print("stepped", flush=True)
            time.sleep(60)
        """)], cwd=REPO, env={**os.environ, "PYTHONWARNINGS": "ignore", "FT_RANK_MONITOR_IPC_SOCKET": rmon,
                              "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
                              "MBR_AUTOBEAT": "1", "MBR_AUTOBEAT_SOCKET": path}, stdout=subprocess.PIPE,
                              text=True)
        mon.send({"op": "pid", "local_rank": 0, "pid": worker.pid, "pgid": None})  # as the agent does: only
        assert mon.wait("connected", 60)  # the worker's process tree may connect
        steps = mon.wait("steps", 60)
        assert steps["ranks"][0]["nvrx_client"] is True
        mon.send({"op": "snapshot"})
        snap = mon.wait("snapshot")
        assert snap["ranks"][0]["step_deadline_enforced"] is False
        # the NVRx heartbeat timeout (30 s here) applies, not the 0.5 s step timeout
        with pytest.raises(AssertionError):
            mon.wait("expired", 3.0)
    finally:
        if worker is not None:
            worker.kill()
            worker.wait()


@pytest.mark.processes
@pytest.mark.parametrize("torch_first", [False, True], ids=["hooked-at-import", "torch-already-imported"])
def test_torch_save_of_a_dict_marks_a_checkpoint(beat_socket, tmp_path, torch_first):
    path, sock = beat_socket
    res = _python(f"""
        {"import torch" if torch_first else ""}
        from mbr_launch.shim import autobeat
        assert autobeat.install()
        import torch
        assert getattr(torch.save, "__mbr_autobeat__", False) and torch.save is torch.serialization.save
        m = torch.nn.Linear(4, 4)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        m(torch.randn(2, 4)).sum().backward()
        opt.step()
        torch.save(torch.zeros(3), {str(tmp_path / "t.pt")!r})  # a tensor: no checkpoint
        torch.save({{"model": m.state_dict(), "step": 1}}, {str(tmp_path / "c.pt")!r})
        print("ok")
    """, {"MBR_AUTOBEAT_SOCKET": path})
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr
    flags = [BEAT.unpack(sock.recv(64))[3] for _ in range(3)]
    assert flags == [FIRST, CHECKPOINT, FINISHED]


def test_a_checkpoint_beat_is_reported_and_is_not_a_step():
    watch = StepWatch(initial=10.0, subsequent=2.0)
    watch.arm(0.0)
    watch.beat(1.0, 1, 1.0, 0.5, FIRST)
    assert watch.take_report()["steps"] == 1
    assert watch.beat(1.5, 1, 0.0, 0.0, CHECKPOINT) is False
    report = watch.take_report()
    assert report is not None and report["checkpoint"] == 1.5 and report["steps"] == 1 and report["periods"] == []
    assert watch.deadline == 3.0  # still from the step at 1.0: a save does not extend the step deadline


# ---- other signs of progress: collectives, distributed checkpoints ----------------------------------------


def _flags(sock: socket.socket) -> list[int]:
    """The flags of every beat waiting on ``sock`` (the worker has exited: all of them are there)."""
    sock.settimeout(0.2)
    flags = []
    while True:
        try:
            flags.append(BEAT.unpack(sock.recv(64))[3])
        except socket.timeout:
            return flags


@pytest.mark.processes
@pytest.mark.parametrize("torch_first", [False, True], ids=["hooked-at-import", "torch-already-imported"])
def test_collectives_send_one_work_mark_once_past_the_start_up_ones(beat_socket, port, torch_first):
    path, sock = beat_socket
    res = _python(f"""
        {"import torch, torch._dynamo, torch.distributed" if torch_first else ""}
        import os
        from mbr_launch.shim import autobeat
        assert autobeat.install()
        import torch, torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        from mbr_launch.shim.autobeat import torchhooks
        for name in torchhooks.COLLECTIVES:  # wrapped once, the same function in both modules
            f = getattr(dist, name)
            assert getattr(f, "__mbr_autobeat__", False) and f is getattr(dist.distributed_c10d, name), name
        # torch.compile still maps dist.all_reduce to its traceable collective
        from torch.distributed._functional_collectives import traceable_collective_remaps
        assert dist.all_reduce in traceable_collective_remaps
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="{port}")
        dist.init_process_group("gloo", rank=0, world_size=1)
        model = DDP(torch.nn.Linear(4, 4))
        dist.barrier()
        seed, gathered = [1234], [None]
        dist.broadcast_object_list(seed)
        dist.all_gather_object(gathered, {{"host": "a"}})
        print("start-up", torchhooks.collectives, flush=True)
        t = torch.ones(2)
        for _ in range(torchhooks.WORK_COLLECTIVES + 10):
            dist.all_reduce(t)
        print("after", torchhooks.collectives, flush=True)
        dist.destroy_process_group()
    """, {"MBR_AUTOBEAT_SOCKET": path})
    assert res.returncode == 0, res.stderr
    start_up = int(res.stdout.split("start-up ")[1].split()[0])
    from mbr_launch.shim.autobeat.torchhooks import WORK_COLLECTIVES

    assert 0 < start_up <= WORK_COLLECTIVES // 2, res.stdout  # a barrier, two object collectives: far below
    assert f"after {WORK_COLLECTIVES}" in res.stdout  # counting stops there
    assert _flags(sock) == [WORK, FINISHED, FINISHED]  # one WORK mark; destroy_process_group, then the exit


@pytest.mark.processes
def test_start_up_alone_sends_no_work_mark(beat_socket, port):
    # init, DDP, a barrier, a DCP save and a DCP load of model and optimizer: start-up (and a checkpoint, which
    # is its own sign), not WORK_COLLECTIVES collectives
    path, sock = beat_socket
    res = _python(f"""
        import os, tempfile
        from mbr_launch.shim import autobeat
        assert autobeat.install()
        import torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
        from torch.nn.parallel import DistributedDataParallel as DDP
        from mbr_launch.shim.autobeat import torchhooks
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="{port}")
        dist.init_process_group("gloo", rank=0, world_size=1)
        model = DDP(torch.nn.Linear(4, 4))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        dist.barrier()
        where = tempfile.mkdtemp()
        dcp.save({{"model": model.state_dict(), "opt": opt.state_dict()}}, checkpoint_id=where)
        dcp.load({{"model": model.state_dict(), "opt": opt.state_dict()}}, checkpoint_id=where)
        print("collectives", torchhooks.collectives, flush=True)
    """, {"MBR_AUTOBEAT_SOCKET": path})
    assert res.returncode == 0, res.stderr
    assert _flags(sock) == [CHECKPOINT, FINISHED], res.stdout


@pytest.mark.processes
@pytest.mark.parametrize("dcp_first", [False, True], ids=["hooked-at-import", "dcp-already-imported"])
def test_distributed_checkpoint_saves_mark_checkpoints(beat_socket, tmp_path, dcp_first):
    path, sock = beat_socket
    res = _python(f"""
        {"import torch.distributed.checkpoint" if dcp_first else ""}
        from mbr_launch.shim import autobeat
        assert autobeat.install()
        import torch, torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint import state_dict_saver
        for name in ("save", "save_state_dict", "async_save"):
            f = getattr(dcp, name)
            assert getattr(f, "__mbr_autobeat__", False) and getattr(state_dict_saver, name) is f, name
        m = torch.nn.Linear(4, 4)
        state = {{"model": m.state_dict(), "step": 3, "extra": {{"note": "x"}}}}
        dcp.save(state, checkpoint_id={str(tmp_path / "a")!r}, no_dist=True)
        print("saved", flush=True)
        future = dcp.async_save(state, checkpoint_id={str(tmp_path / "b")!r}, no_dist=True)
        getattr(future, "upload_completion", future).result()
        import time; time.sleep(0.2)  # the done callback runs on the executor's thread
        print("async saved", flush=True)
    """, {"MBR_AUTOBEAT_SOCKET": path})
    assert res.returncode == 0 and "async saved" in res.stdout, res.stderr
    flags = _flags(sock)
    # one mark for the save (torch.save calls inside it mark nothing); the asynchronous one is marked when its
    # upload completes, by its future and by the save its executor thread runs
    assert flags[0] == CHECKPOINT and flags[-1] == FINISHED and set(flags[1:-1]) == {CHECKPOINT}, flags
    assert 2 <= len(flags) - 1 <= 3, flags


@pytest.mark.processes
def test_install_while_another_thread_imports_torch_hooks_everything(beat_socket, tmp_path, port):
    # A warm standby assigned in the middle of its preload: boot installs autobeat while the preload thread
    # is still inside `import torch`.
    path, sock = beat_socket
    res = _python(f"""
        import os, sys, threading, time
        from mbr_launch.shim import autobeat
        preload = threading.Thread(target=lambda: __import__("torch.distributed"))
        preload.start()
        while autobeat.TARGET not in sys.modules:  # the last of ours that import torch imports
            time.sleep(0.0002)
        concurrent = autobeat._initializing(sys.modules["torch"])
        assert autobeat.install()
        preload.join()
        time.sleep(0.2)  # the hooking thread polls every 5 ms
        import torch, torch.distributed as dist
        from mbr_launch.shim.autobeat import torchhooks
        assert autobeat.installed() and getattr(torch.save, "__mbr_autobeat__", False)
        assert getattr(dist.all_reduce, "__mbr_autobeat__", False) and getattr(dist.destroy_process_group,
                                                                               "__mbr_autobeat__", False)
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="{port}")
        dist.init_process_group("gloo", rank=0, world_size=1)
        m = torch.nn.Linear(2, 2)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        m(torch.ones(1, 2)).sum().backward()
        opt.step()
        for _ in range(torchhooks.WORK_COLLECTIVES):
            dist.all_reduce(torch.ones(1))
        torch.save({{"model": m.state_dict()}}, {str(tmp_path / "c.pt")!r})
        dist.destroy_process_group()
        print("concurrent", concurrent)
    """, {"MBR_AUTOBEAT_SOCKET": path})
    assert res.returncode == 0, res.stderr
    assert "concurrent True" in res.stdout  # the case this test is about did happen
    assert _flags(sock) == [FIRST, WORK, CHECKPOINT, FINISHED, FINISHED]


def test_the_finder_waits_for_the_modules_the_hooks_are_for():
    from mbr_launch.shim import autobeat
    from mbr_launch.shim.autobeat import torchhooks

    assert set(autobeat.HOOKED) == set(torchhooks.AT_EXEC) == set(torchhooks.IMPORTED)
    assert (autobeat.TARGET, autobeat.C10D, autobeat.SERIALIZATION, autobeat.DCP, autobeat.FUNCTIONAL) == \
        (torchhooks.TARGET, torchhooks.C10D, torchhooks.SERIALIZATION, torchhooks.DCP, torchhooks.FUNCTIONAL)


def test_work_and_checkpoint_marks_are_progress_not_steps():
    from mbr_launch.monitor.steps import COLLECTIVES, mark_sign

    watch = StepWatch(initial=10.0, subsequent=2.0)
    watch.arm(0.0)
    assert watch.beat(1.0, 0, 0.0, 0.0, WORK) is False
    assert (watch.steps, watch.work_at, watch.deadline) == (0, 1.0, 10.0)  # no step, the initial deadline stays
    assert watch.progress is None  # the monitor records the sign (beats.py), the watch only keeps it
    assert mark_sign(WORK) == COLLECTIVES and mark_sign(CHECKPOINT) == "checkpoint" and mark_sign(FIRST) is None
    assert watch.note_progress(COLLECTIVES, 1.0) is True and watch.note_progress("checkpoint", 2.0) is False
    assert watch.beat(3.0, 1, 3.0, 1.0, FIRST) is True  # the first step is still reported (telemetry)
    assert (watch.progress, watch.progress_at) == (COLLECTIVES, 1.0)  # the first sign is kept
    watch.arm(10.0)
    assert watch.progress is None and watch.work_at is None  # a new worker starts over
    watch.beat(11.0, 1, 1.0, 1.0, FIRST)
    assert watch.progress == "step"
