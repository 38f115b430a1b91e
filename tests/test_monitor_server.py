"""The real monitor process against real NVRx 0.4.1 ``RankMonitorClient`` in real worker processes."""

from __future__ import annotations

import json
import os
import pickle
import queue
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Optional

import pytest

from testkit.nvrx_versions import INSTALLED, nvrx_env

REPO = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.timeout(120), pytest.mark.processes]

WORKER = textwrap.dedent(
    """
    import json, sys, time
    from nvidia_resiliency_ext.fault_tolerance import (
        RankMonitorClient, RankMonitorClientError, WorkloadAction, WorkloadControlRequest)

    def out(**kw):
        print(json.dumps(kw), flush=True)

    mode, args = sys.argv[1], sys.argv[2:]
    c = RankMonitorClient()
    out(ev="connecting")
    if mode == "load":
        c.load_state_dict(json.load(open(args[0])))
    try:
        c.init_workload_monitoring()
    except RankMonitorClientError as e:
        out(ev="client_error", message=str(e))
        sys.exit(0)
    cfg = c.cfg
    out(ev="init", cfg={"initial": cfg.initial_rank_heartbeat_timeout, "subsequent": cfg.rank_heartbeat_timeout,
                        "sections": dict(cfg.rank_section_timeouts), "oos": cfg.rank_out_of_section_timeout,
                        "safety_factor": cfg.safety_factor, "signal": cfg.rank_termination_signal.name,
                        "type": type(cfg).__module__ + "." + type(cfg).__name__})

    def hang():
        out(ev="hanging")
        time.sleep(600)

    if mode == "hb_hang":
        for _ in range(5):
            c.send_heartbeat()
            time.sleep(0.05)
        hang()
    elif mode == "init_hang":
        hang()
    elif mode == "section_hang":
        c.send_heartbeat()
        c.start_section("step")
        hang()
    elif mode == "oos_hang":
        for _ in range(3):
            c.start_section("step")
            time.sleep(0.02)
            c.end_section("step")
        hang()
    elif mode == "calc":
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args[1]}", rank=0, world_size=1)
        for _ in range(3):
            c.start_section("step")
            time.sleep(0.1)
            c.end_section("step")
        c.calculate_and_set_section_timeouts(calc_out_of_section=False)
        json.dump(c.state_dict(), open(args[0], "w"))
        out(ev="calculated", section=dict(c.section_timeouts.section))
        c.start_section("step")
        hang()
    elif mode == "load":
        c.start_section("step")
        hang()
    elif mode == "workload":
        c.send_workload_control_request(WorkloadControlRequest(WorkloadAction.ExcludeThisNode, "bad GPU"))
        out(ev="sent")
    elif mode == "sections_then_exclude":
        for _ in range(3):
            c.start_section("step")
            c.send_heartbeat()
            c.end_section("step")
        c.send_workload_control_request(WorkloadControlRequest(WorkloadAction.ExcludeThisNode, "bad GPU"))
        out(ev="sent")
    elif mode == "unknown_section":
        try:
            c.start_section("nope")
        except RankMonitorClientError as e:
            out(ev="client_error", message=str(e))
        c.send_heartbeat()
        out(ev="still_ok")
    elif mode == "steady":
        out(ev="steady")
        end = time.monotonic() + float(args[0])
        n = 0
        while time.monotonic() < end:
            c.send_heartbeat()
            c.start_section("step")
            c.end_section("step")
            n += 1
            time.sleep(0.01)
        c.shutdown_workload_monitoring()  # disconnect: the monitor stops timing this rank
        out(ev="done", n=n)
    """
)


# A process of the worker's tree that sends raw frames: (socket path, bytes) pairs from a pickle file.
ATTACKER = textwrap.dedent(
    """
    import json, pickle, socket, sys
    for target, data in pickle.load(open(sys.argv[1], "rb")):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(10)
            s.connect(target)
            s.sendall(data)
            try:
                got = s.recv(1 << 16)
            except (ConnectionResetError, BrokenPipeError):
                got = b""
        print(json.dumps({"ev": "reply", "data": got.hex()}), flush=True)
    print(json.dumps({"ev": "attacks_done"}), flush=True)
    """
)


class Lines:
    """Background reader turning a text stream of JSON lines into a queue."""

    def __init__(self, stream) -> None:
        self.q: "queue.Queue[Optional[dict[str, Any]]]" = queue.Queue()
        self.all: list[dict[str, Any]] = []
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream) -> None:
        for line in stream:
            line = line.strip()
            if line.startswith("{"):
                self.q.put(json.loads(line))
        self.q.put(None)

    def wait(self, ev: str, timeout: float = 60.0, **match: Any) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {ev} {match} within {timeout}s; saw {self.all}")
            try:
                item = self.q.get(timeout=left)
            except queue.Empty:
                continue
            if item is None:
                raise AssertionError(f"stream closed before {ev} {match}; saw {self.all}")
            self.all.append(item)
            if item.get("ev") == ev and all(item.get(k) == v for k, v in match.items()):
                return item

    def drain(self, settle: float) -> list[dict[str, Any]]:
        time.sleep(settle)
        while True:
            try:
                item = self.q.get_nowait()
            except queue.Empty:
                return self.all
            if item is not None:
                self.all.append(item)


class Mon:
    def __init__(self, tmp: Path, cfg: dict[str, Any]) -> None:
        self.dir = tmp / "rundir"
        self.dir.mkdir(mode=0o700)
        self.worker = tmp / "worker.py"
        self.worker.write_text(WORKER)
        self.tmp = tmp
        self.stderr = tmp / "monitor.stderr"  # must stay empty: no traceback ever reaches the console
        with open(self.stderr, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "mbr_launch.monitor.server"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True, cwd=REPO,
            )
        self.events = Lines(self.proc.stdout)
        self.clients: list[subprocess.Popen] = []
        full = {"initial_rank_heartbeat_timeout": None, "rank_heartbeat_timeout": None, "rank_section_timeouts": {},
                "rank_out_of_section_timeout": None, "workload_check_interval": 5.0, "safety_factor": 5.0,
                "rank_termination_signal": "SIGKILL", "log_level": 20, "restart_check_interval": 60.0,
                "enable_nic_monitor": False, "node_health_check_interval": 5.0, **cfg}
        self.send(op="configure", dir=str(self.dir), cfg=full)
        self.launcher_socket = self.events.wait("ready")["launcher_socket"]

    def send(self, **msg: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()

    def arm(self, local_rank: int = 0, rank: int = 0) -> str:
        sock = str(self.dir / f"rmon{local_rank}.sock")
        self.send(op="arm", local_rank=local_rank, rank=rank, pid=None, pgid=None, socket=sock)
        self.events.wait("armed", local_rank=local_rank)
        return sock

    def spawn(self, mode: str, *args: str, local_rank: int = 0, rank: int = 0, nvrx: str = INSTALLED,
              script: Optional[Path] = None) -> tuple[subprocess.Popen, Lines]:
        """A client process running ``script`` (default: WORKER) with NVRx ``nvrx``'s real client."""
        env = nvrx_env(nvrx, dict(os.environ, RANK=str(rank), LOCAL_RANK=str(local_rank), PYTHONUNBUFFERED="1",
                                  FT_RANK_MONITOR_IPC_SOCKET=str(self.dir / f"rmon{local_rank}.sock"),
                                  FT_LAUNCHER_IPC_SOCKET=self.launcher_socket))
        proc = subprocess.Popen([sys.executable, str(script or self.worker), mode, *args], env=env,
                                stdout=subprocess.PIPE, text=True, start_new_session=True)
        self.clients.append(proc)
        self.send(op="pid", local_rank=local_rank, pid=proc.pid, pgid=proc.pid)
        return proc, Lines(proc.stdout)

    def attack(self, frames: list[tuple[str, bytes]], local_rank: int) -> tuple[subprocess.Popen, Lines]:
        """Send ``frames`` from a process the agent armed ``local_rank`` with (so it passes the pid check)."""
        path = self.tmp / f"attacks{len(self.clients)}.pkl"
        path.write_bytes(pickle.dumps(frames))
        proc = subprocess.Popen([sys.executable, "-c", ATTACKER, str(path)], stdout=subprocess.PIPE, text=True,
                                start_new_session=True)
        self.clients.append(proc)
        self.send(op="pid", local_rank=local_rank, pid=proc.pid, pgid=proc.pid)
        return proc, Lines(proc.stdout)

    def close(self) -> None:
        for proc in self.clients:
            _killpg(proc)
        if self.proc.poll() is None:
            try:
                self.send(op="exit")
            except (BrokenPipeError, ValueError):
                pass
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _connected_unix_sockets(pid: int) -> int:
    """How many of ``pid``'s descriptors are connected Unix stream sockets (``/proc/net/unix`` state 03)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    rows = [line.split() for line in Path("/proc/net/unix").read_text().splitlines()[1:]]
    return sum(1 for row in rows if len(row) >= 7 and row[6] in inodes and row[5] == "03")


def _killpg(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(10)


@pytest.fixture
def make_mon(tmp_path):
    mons: list[Mon] = []

    def make(**cfg: Any) -> Mon:
        home = tmp_path / f"m{len(mons)}"
        home.mkdir()
        mons.append(Mon(home, cfg))
        return mons[-1]

    yield make
    for m in mons:
        m.close()


def assert_one_expiry(mon: Mon, local_rank: int, **match: Any) -> dict[str, Any]:
    ev = mon.events.wait("expired", local_rank=local_rank, **match)
    # Reported on a timer, not a poll: late by well under 0.2 s even on a loaded machine.
    assert ev["timeout"] <= ev["elapsed"] <= ev["timeout"] + 0.2, ev
    seen = mon.events.all
    start = len(seen) - 1 - seen[::-1].index(ev)
    later = [e for e in mon.events.drain(0.5)[start + 1 :] if e.get("ev") == "expired" and e.get("local_rank") == local_rank]
    assert later == [], later
    return ev


# ---- tests --------------------------------------------------------------------------------------------------


def test_monitor_does_not_import_heavy_modules():
    code = ("import sys, mbr_launch.monitor.server; "
            "bad = [m for m in ('torch', 'typer', 'rich', 'nvidia_resiliency_ext') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, timeout=30)


def test_init_gets_our_config_and_heartbeats_keep_it_alive(make_mon):
    mon = make_mon(initial_rank_heartbeat_timeout=30.0, rank_heartbeat_timeout=0.6,
                   rank_section_timeouts={"step": 0.6, "ckpt": None}, rank_out_of_section_timeout=0.6,
                   safety_factor=2.5, rank_termination_signal="SIGTERM")
    mon.arm(0, rank=0)
    proc, out = mon.spawn("steady", "2.0")
    cfg = out.wait("init")["cfg"]
    assert cfg == {"initial": 30.0, "subsequent": 0.6, "sections": {"step": 0.6, "ckpt": None}, "oos": 0.6,
                   "safety_factor": 2.5, "signal": "SIGTERM",
                   "type": "nvidia_resiliency_ext.fault_tolerance.config.FaultToleranceConfig"}
    assert mon.events.wait("connected", local_rank=0)["pid"] == proc.pid
    assert mon.events.wait("first_heartbeat", local_rank=0)["t"] > 0
    mon.send(op="snapshot")
    snap = mon.events.wait("snapshot")["ranks"][0]
    assert snap["connected"] and snap["state"] == "monitoring" and snap["timeouts"]["subsequent"] == 0.6
    assert out.wait("done", timeout=30)["n"] > 10  # 2 s of traffic, 3x each 0.6 s timeout, no expiry
    assert proc.wait(30) == 0
    mon.events.wait("disconnected", local_rank=0)
    assert not [e for e in mon.events.drain(0.2) if e["ev"] in ("expired", "error")]


def test_a_worker_that_connects_before_its_rank_is_re_armed_is_served(make_mon):
    """The agent starts a later round's worker without waiting for 'armed' (``MonitorLink.arm``): here the
    monitor is stopped while the arm is sent and the new worker connects, so both wait in one batch; the
    arm must be handled first, else it drops the new worker's connection as the old one's."""
    mon = make_mon(initial_rank_heartbeat_timeout=30.0, rank_heartbeat_timeout=1.5,
                   rank_section_timeouts={"step": 1.5}, rank_out_of_section_timeout=1.5)
    mon.arm(0, rank=0)
    first, out = mon.spawn("steady", "0.5")
    assert out.wait("done", timeout=30)["n"] > 0 and first.wait(30) == 0
    mon.events.wait("disconnected", local_rank=0)
    os.kill(mon.proc.pid, signal.SIGSTOP)
    try:
        mon.send(op="arm", local_rank=0, rank=0, pid=None, pgid=None, socket=str(mon.dir / "rmon0.sock"))
        proc, out = mon.spawn("steady", "2.0")
        out.wait("connecting", timeout=60)
        deadline = time.monotonic() + 30
        while not _connected_unix_sockets(proc.pid):  # in the stopped monitor's backlog
            assert time.monotonic() < deadline, "the client never connected"
            time.sleep(0.05)
        time.sleep(0.3)  # and its init message sent
    finally:
        os.kill(mon.proc.pid, signal.SIGCONT)
    assert mon.events.wait("connected", local_rank=0)["pid"] == proc.pid
    assert out.wait("done", timeout=30)["n"] > 10  # served to the end: never dropped, no expiry
    assert proc.wait(30) == 0
    assert not [e for e in mon.events.all if e["ev"] in ("expired", "error")]


def test_heartbeat_hang_expires_once(make_mon):
    mon = make_mon(initial_rank_heartbeat_timeout=30.0, rank_heartbeat_timeout=0.5)
    mon.arm(0, rank=7)
    proc, out = mon.spawn("hb_hang", rank=7)
    out.wait("hanging")
    ev = assert_one_expiry(mon, 0, kind="heartbeat")
    assert ev["rank"] == 7 and ev["pid"] == proc.pid and ev["section"] is None
    assert ev["last_heartbeat_age"] == pytest.approx(ev["elapsed"], abs=1e-3)
    assert proc.poll() is None  # the monitor reports; the agent kills


def test_initial_heartbeat_hang(make_mon):
    mon = make_mon(initial_rank_heartbeat_timeout=0.7, rank_heartbeat_timeout=0.2)
    mon.arm(0)
    _, out = mon.spawn("init_hang")
    out.wait("hanging")
    ev = assert_one_expiry(mon, 0, kind="initial_heartbeat")
    assert ev["last_heartbeat_age"] is None


def test_section_hang_expires_once(make_mon):
    mon = make_mon(rank_section_timeouts={"step": 0.5, "other": 0.1}, rank_out_of_section_timeout=0.3)
    mon.arm(0)
    _, out = mon.spawn("section_hang")
    out.wait("hanging")
    ev = assert_one_expiry(mon, 0, kind="section")
    assert ev["section"] == "step" and ev["timeout"] == 0.5 and ev["open_sections"] == ["step"]


def test_out_of_section_hang_expires_once(make_mon):
    mon = make_mon(rank_section_timeouts={"step": 5.0}, rank_out_of_section_timeout=0.5)
    mon.arm(0)
    _, out = mon.spawn("oos_hang")
    out.wait("hanging")
    ev = assert_one_expiry(mon, 0, kind="out_of_section")
    assert ev["section"] is None and ev["open_sections"] == []


def test_calculated_timeouts_are_enforced_and_survive_restart_via_state_dict(make_mon, tmp_path, port):
    mon = make_mon(rank_section_timeouts={"step": 60.0}, safety_factor=4.0)
    mon.arm(0)
    state = tmp_path / "ft_state.json"
    _, out = mon.spawn("calc", str(state), str(port))
    new = out.wait("calculated", timeout=90)["section"]["step"]
    assert 0.35 < new < 3.0  # 4 x ~0.1 s
    upd = mon.events.wait("timeouts_updated", local_rank=0)
    assert upd["hb"] is None
    assert upd["section"]["section"]["step"] == pytest.approx(new)
    assert upd["section"]["calculated_sections"] == ["step"]
    ev = assert_one_expiry(mon, 0, kind="section")
    assert ev["timeout"] == pytest.approx(new)

    # Restart: re-arm resets to the configured 60 s; the new client restores the saved timeouts.
    _killpg(mon.clients[-1])
    mon.arm(0)
    mon.send(op="snapshot")
    assert mon.events.wait("snapshot")["ranks"][0]["timeouts"]["sections"] == {"step": 60.0}
    _, out = mon.spawn("load", str(state))
    out.wait("hanging")
    assert mon.events.wait("timeouts_updated", local_rank=0)["section"]["section"]["step"] == pytest.approx(new)
    ev = assert_one_expiry(mon, 0, kind="section")
    assert ev["timeout"] == pytest.approx(new)


def test_workload_request_is_forwarded(make_mon):
    mon = make_mon()
    mon.arm(0, rank=3)
    proc, out = mon.spawn("workload", rank=3)
    out.wait("sent")
    ev = mon.events.wait("workload_request")
    assert ev == {"ev": "workload_request", "rank": 3, "action": "ExcludeThisNode", "description": "bad GPU"}
    assert proc.wait(30) == 0


def test_unknown_section_behaves_like_nvrx_041(make_mon):
    mon = make_mon(rank_section_timeouts={"step": 1.0}, rank_heartbeat_timeout=10.0)
    mon.arm(0)
    proc, out = mon.spawn("unknown_section")
    msg = out.wait("client_error")["message"]
    assert "Unknown section: nope" in msg  # raised by the 0.4.1 client after the server accepted the open
    out.wait("still_ok")
    assert proc.wait(30) == 0


class _Evil:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def _frame(payload: bytes) -> bytes:
    return len(payload).to_bytes(4, "big") + payload


def test_malicious_pickle_is_dropped_and_legit_client_keeps_working(make_mon, tmp_path):
    mon = make_mon(rank_heartbeat_timeout=5.0, rank_section_timeouts={"step": 5.0})
    mon.arm(0)
    attacker_sock = mon.arm(1, rank=1)
    proc, out = mon.spawn("steady", "4.0")
    out.wait("steady")
    marker = Path("/tmp") / f"pwned-{uuid.uuid4().hex}"
    attacks = [
        _frame(pickle.dumps(_Evil(str(marker)))),
        (0).to_bytes(4, "big"),  # bad length
        (1 << 30).to_bytes(4, "big") + b"x",  # oversized frame
        _frame(b"not a pickle at all"),
    ]
    frames = [(target, attack) for target in (attacker_sock, mon.launcher_socket) for attack in attacks]
    attacker, said = mon.attack(frames, local_rank=1)
    said.wait("attacks_done")
    assert [r["data"] for r in said.all if r["ev"] == "reply"] == [""] * len(frames)  # dropped without a reply
    errors = [e for e in mon.events.drain(0.5) if e["ev"] == "error"]
    assert len(errors) == len(frames) and all("connection dropped" in e["message"] for e in errors), errors
    assert not marker.exists()
    assert out.wait("done", timeout=60)["n"] > 10
    assert proc.wait(30) == 0
    assert not [e for e in mon.events.drain(0.2) if e["ev"] == "expired"]
    assert mon.stderr.read_bytes() == b""


def test_config_dir_must_be_private(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    os.chmod(shared, 0o777)
    proc = subprocess.Popen([sys.executable, "-m", "mbr_launch.monitor.server"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, cwd=REPO)
    out, _ = proc.communicate(json.dumps({"op": "configure", "dir": str(shared), "cfg": {}}) + "\n", timeout=30)
    ev = json.loads(out.splitlines()[0])
    assert ev["ev"] == "error" and "0700" in ev["message"]
    assert proc.returncode == 0 and os.listdir(shared) == []


def test_bad_control_lines_are_reported(make_mon):
    mon = make_mon()
    for line in ("not json", json.dumps({"op": "fly"}), json.dumps({"op": "arm", "local_rank": "x"}),
                 json.dumps({"op": "arm", "local_rank": 0, "socket": "/tmp/elsewhere.sock"})):
        assert mon.proc.stdin is not None
        mon.proc.stdin.write(line + "\n")
        mon.proc.stdin.flush()
        mon.events.wait("error")
    assert not os.path.exists("/tmp/elsewhere.sock")


def test_disarm_stops_verdicts_and_drops_connection(make_mon):
    mon = make_mon(rank_section_timeouts={"step": 1.0})
    mon.arm(0)
    proc, out = mon.spawn("section_hang")
    out.wait("hanging")
    mon.send(op="disarm", local_rank=0)
    mon.events.wait("disarmed", local_rank=0)
    assert not [e for e in mon.events.drain(1.5) if e["ev"] == "expired"]
    mon.send(op="snapshot")
    assert mon.events.wait("snapshot")["ranks"][0]["state"] == "disarmed"


def test_stdin_eof_kills_armed_process_groups(make_mon, tmp_path):
    mon = make_mon(rank_heartbeat_timeout=100.0)
    mon.arm(0)
    mon.arm(1)
    victims = []
    for lr in (0, 1):
        # A worker with a grandchild in its process group: both must die.
        p = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                              "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
                              "time.sleep(600)"], start_new_session=True)
        mon.clients.append(p)
        mon.send(op="pid", local_rank=lr, pid=p.pid, pgid=p.pid)
        victims.append(p)
    time.sleep(1.0)  # let the grandchildren start
    members = {p.pid: _group_members(p.pid) for p in victims}
    assert all(len(m) == 2 for m in members.values()), members
    assert mon.proc.stdin is not None
    mon.proc.stdin.close()  # the agent died
    assert mon.proc.wait(10) == 0
    for p in victims:
        assert p.wait(10) == -signal.SIGKILL
    deadline = time.monotonic() + 5
    while any(_group_members(pg) for pg in members) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_group_members(pg) for pg in members)
    assert not [f for f in os.listdir(mon.dir)]  # sockets removed


def _group_members(pgid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                found.append(int(entry))
    return found


# ---- hostile frames and hostile neighbours (issue 16) --------------------------------------------------------

_DATA = "nvidia_resiliency_ext.fault_tolerance.data"


def _nvrx_frame(obj: Any) -> bytes:
    """A real frame: an NVRx 0.4.1 object pickled the way its client does."""
    from multiprocessing.reduction import ForkingPickler

    return _frame(bytes(ForkingPickler.dumps(obj)))


def _str_op(text: str) -> bytes:
    raw = text.encode()
    return b"\x8c" + bytes([len(raw)]) + raw  # SHORT_BINUNICODE


def _empty_members(enum_name: str) -> bytes:
    """BUILD on an allowed enum class itself: setattr its member maps to {} (pickle's slot-state form)."""
    return _frame(b"\x80\x04" + _str_op(_DATA) + _str_op(enum_name) + b"\x93N}(" + _str_op("_value2member_map_")
                  + b"}" + _str_op("_member_map_") + b"}u\x86b.")


class _Renamed:
    """Pickles as WorkloadAction(1) followed by BUILD {'_name_': 'Continue'}: renames the shared member."""

    def __reduce__(self):
        from nvidia_resiliency_ext.fault_tolerance.data import WorkloadAction

        return (WorkloadAction, (1,), {"_name_": "Continue"})


def test_frames_cannot_change_shared_classes(make_mon):
    from nvidia_resiliency_ext.fault_tolerance.data import WorkloadControlRequest

    mon = make_mon(rank_section_timeouts={"step": 5.0})
    mon.arm(0, rank=0)
    attacker_sock = mon.arm(1, rank=1)
    frames = [_nvrx_frame((1, WorkloadControlRequest(_Renamed(), "renamed"))),
              _empty_members("SectionAction"), _empty_members("WorkloadAction")]
    _, said = mon.attack([(t, f) for t in (mon.launcher_socket, attacker_sock) for f in frames], local_rank=1)
    said.wait("attacks_done")
    assert [r["data"] for r in said.all if r["ev"] == "reply"] == [""] * 6  # all dropped
    # Then a genuine client: its sections still decode, and its ExcludeThisNode is still ExcludeThisNode.
    proc, out = mon.spawn("sections_then_exclude", rank=0)
    out.wait("sent")
    assert proc.wait(30) == 0
    events = mon.events.drain(0.3)
    assert [e for e in events if e["ev"] == "workload_request"] == [
        {"ev": "workload_request", "rank": 0, "action": "ExcludeThisNode", "description": "bad GPU"}]
    errors = [e["message"] for e in events if e["ev"] == "error"]
    assert len(errors) == 6 and all("connection dropped" in m for m in errors), errors
    assert mon.stderr.read_bytes() == b""


def test_bad_values_are_refused_without_a_traceback(make_mon, tmp_path):
    from nvidia_resiliency_ext.fault_tolerance.data import HeartbeatTimeouts, SectionTimeouts, UpdateConfigMsg

    mon = make_mon(rank_section_timeouts={"step": 60.0})
    mon.arm(0)
    attacker_sock = mon.arm(1, rank=1)
    deep: list = []
    for _ in range(3000):
        deep = [deep]
    sections = SectionTimeouts(section={})
    sections.calculated_sections = [deep]
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(10_000)  # only to pickle it here; the monitor must cope at its default limit
    try:
        nested = _nvrx_frame(UpdateConfigMsg(None, sections))
    finally:
        sys.setrecursionlimit(limit)
    overflow = _nvrx_frame(UpdateConfigMsg(HeartbeatTimeouts(initial=10**400, subsequent=1.0), None))
    _, said = mon.attack([(attacker_sock, nested), (attacker_sock, overflow)], local_rank=1)
    said.wait("attacks_done")
    replies_ = [bytes.fromhex(r["data"]) for r in said.all if r["ev"] == "reply"]
    assert replies_[0] == b""  # too deep: dropped
    assert b"ErrorMsg" in replies_[1] and b"initial: timeout" in replies_[1]  # refused with a reason
    # A real client whose saved timeouts are far beyond what epoll can wait: accepted, and the monitor lives.
    state = tmp_path / "far.json"
    state.write_text(json.dumps({"current_timeouts": {
        "heartbeat": {"initial": 1e7, "subsequent": 1e7, "were_calculated": True},
        "section": {"section": {"step": 1e7}, "out_of_section": None, "calculated_sections": ["step"],
                    "is_out_of_section_calculated": False}}}))
    _, out = mon.spawn("load", str(state))
    out.wait("hanging")
    mon.events.wait("timeouts_updated", local_rank=0)
    time.sleep(0.5)
    mon.send(op="snapshot")
    assert mon.events.wait("snapshot")["ranks"][0]["timeouts"]["sections"] == {"step": 1e7}
    errors = [e["message"] for e in mon.events.all if e["ev"] == "error"]
    assert len(errors) == 2 and "nested deeper" in errors[0] and "refused a request" in errors[1], errors
    assert mon.proc.poll() is None
    assert mon.stderr.read_bytes() == b""


def test_a_process_outside_the_workers_tree_is_refused(make_mon):
    from nvidia_resiliency_ext.fault_tolerance import data

    mon = make_mon(rank_heartbeat_timeout=5.0, rank_section_timeouts={"step": 5.0})
    sock_path = mon.arm(0)
    proc, out = mon.spawn("steady", "3.0")
    out.wait("steady")
    mon.events.wait("connected", local_rank=0)
    # This test process is no descendant of the worker: it claims pid 1 and asks for 0.5 s timeouts.
    init = data.InitMsg()
    init.rank_info = data.RankInfo(global_rank=0, local_rank=0, host="elsewhere", pid=1)
    forged = (_nvrx_frame(data.AuthkeyMsg()) + _nvrx_frame(init)
              + _nvrx_frame(data.UpdateConfigMsg(data.HeartbeatTimeouts(0.5, 0.5, True), None)))
    request = _nvrx_frame((0, data.WorkloadControlRequest(data.WorkloadAction.ShutdownWorkload, "forged")))
    for target, frames in ((sock_path, forged), (mon.launcher_socket, request)):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(10)
            s.connect(target)
            try:
                s.sendall(frames)
                assert s.recv(100) == b""  # closed without an answer
            except (BrokenPipeError, ConnectionResetError):
                pass  # closed before the frames were all sent: the refusal comes at the connection, by the kernel's pid
    assert out.wait("done", timeout=60)["n"] > 10
    assert proc.wait(30) == 0
    events = mon.events.drain(0.3)
    refused = [e for e in events if e["ev"] == "error"]
    assert len(refused) == 2 and all(f"refused a connection from pid {os.getpid()}" in e["message"]
                                     for e in refused), refused
    assert refused[0]["local_rank"] == 0 and refused[0]["pid"] == os.getpid()
    assert [e["pid"] for e in events if e["ev"] == "connected"] == [proc.pid]
    assert not [e for e in events if e["ev"] in ("expired", "workload_request", "timeouts_updated")]


def test_the_agents_link_starts_it_without_site_from_anywhere(tmp_path, monkeypatch):
    """``MonitorLink`` runs the monitor with ``python -S`` (no site initialisation, no ``.pth`` files): it
    still finds this package from another working directory, with no PYTHONPATH of the user's, and answers."""
    from mbr_launch.monitor.link import MonitorLink

    monkeypatch.chdir(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    link = MonitorLink(lambda event: None, env=env).spawn()
    try:
        sock_dir = tmp_path / "sock"
        sock_dir.mkdir(mode=0o700)
        link.start(sock_dir, {"rank_heartbeat_timeout": None, "workload_check_interval": 5.0}, timeout=30)
        assert link.launcher_socket, "no ready reply"
        cmdline = Path(f"/proc/{link.pid}/cmdline").read_bytes().split(b"\0")  # read once it has answered
        assert cmdline[1:3] == [b"-S", b"-m"], cmdline
    finally:
        link.close()
