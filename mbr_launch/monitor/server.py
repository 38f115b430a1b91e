"""The per-node rank monitor process: ``python -m mbr_launch.monitor.server``.

The agent drives it with JSON lines on stdin and reads events from stdout (``control.py`` lists them).
Workers' unchanged NVRx 0.4.1 ``RankMonitorClient`` connect to the per-rank sockets the agent arms.

Threads: the main thread runs an ``epoll`` loop over stdin, the listening sockets and a wake-up pipe; its
timeout is the earliest rank deadline, so an expiry is reported about a millisecond after it happens
instead of on a poll interval. Each client connection gets a thread doing blocking ``recv``/``sendall``:
measured against a single epoll loop it saves ~10 us per round trip (no ``epoll_wait`` and no Python
dispatch between the client's separate header and payload writes). One lock guards all rank state; a
connection thread wakes the main thread only when it makes a deadline earlier than the planned wake-up
(heartbeats only ever move deadlines later).

The monitor never kills on expiry; it reports and the agent decides. The one exception is the agent's
death: stdin EOF means nobody is left to clean up, so every armed worker's process group is SIGKILLed.
For the same reason the monitor ignores the signals that hit a whole job (Ctrl-C, Slurm's SIGTERM and
preemption signals): its life ends only through the agent (``exit`` or EOF) or SIGKILL.

Must not import torch, NVRx, typer or rich: startup cost.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import struct
import sys
import threading
import time
from typing import Any, Callable, Optional

from mbr_launch.monitor import replies
from mbr_launch.monitor.control import (
    ControlError,
    Emitter,
    LineReader,
    _timeout,
    check_private_dir,
    configured_timeouts,
    parse_socket_path,
)
from mbr_launch.monitor.deadlines import InvalidTransition, Phase, RankWatch, SectionError, next_deadline, next_verdict
from mbr_launch.monitor.steps import BEAT, StepWatch, is_checkpoint_section
from mbr_launch.monitor.protocol import (
    Authkey,
    Decoder,
    Heartbeat,
    Init,
    Invalid,
    ProtocolError,
    SectionClose,
    SectionCloseAll,
    SectionOpen,
    UpdateConfig,
    decode_workload_request,
    frame_length,
)

_PEERCRED = struct.Struct("3i")


class Conn:
    __slots__ = ("sock", "slot", "dropped")

    def __init__(self, sock: socket.socket, slot: Optional["Slot"]) -> None:
        self.sock = sock
        self.slot = slot  # None: a launcher-socket (workload request) connection
        self.dropped = False  # detached from its slot; the serving thread closes the socket


class Slot:
    """One local rank: its listening socket, its client connections and its deadlines."""

    def __init__(self, local_rank: int, watch: RankWatch) -> None:
        self.local_rank = local_rank
        self.rank: Optional[int] = None
        self.pid: Optional[int] = None
        self.pgid: Optional[int] = None
        self.path = ""
        self.listener: Optional[socket.socket] = None
        self.conns: set[Conn] = set()
        self.active: Optional[Conn] = None  # the connection whose InitMsg started this session
        self.client_pid: Optional[int] = None
        self.watch = watch
        self.steps = StepWatch()
        self.step_sock: Optional[socket.socket] = None  # automatic step beats (datagrams), when armed with one
        self.step_path = ""

    def deadline(self) -> Optional[float]:
        d, s = next_deadline(self.watch), self.steps.deadline
        return s if d is None else d if s is None else min(d, s)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = sock.recv(n)
    while len(data) < n:
        more = sock.recv(n - len(data))
        if not more:
            raise EOFError
        data += more
    return data


class Monitor:
    def __init__(self, emit: Callable[[dict[str, Any]], None], clock: Callable[[], float] = time.monotonic) -> None:
        self.emit = emit  # called with self.lock held: events never interleave
        self.clock = clock
        self.lock = threading.Lock()
        self.ep = select.epoll()
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.ep.register(self.wake_r, select.EPOLLIN)
        self.cfg: Optional[dict[str, Any]] = None
        self.dir = ""
        self.slots: dict[int, Slot] = {}
        self.listeners: dict[int, tuple[socket.socket, Optional[Slot]]] = {}
        self.conns: set[Conn] = set()
        self.threads: set[threading.Thread] = set()
        self.launcher_path: Optional[str] = None
        self.decoder = Decoder()
        self.next_check: Optional[float] = None  # may be early (then we recompute), never late
        self.step_socks: dict[int, Slot] = {}
        self.step_timeouts: tuple[Optional[float], Optional[float]] = (None, None)  # initial, subsequent
        self.report_interval = 1.0
        self.report_at: Optional[float] = None  # when pending step times go to the agent
        self.status_interval: Optional[float] = None  # periodic status events for the agent's display
        self.status_at: Optional[float] = None
        self.running = True
        self.handlers: dict[type, Callable[[Slot, Conn, Any], bytes]] = {
            Heartbeat: self._on_heartbeat,
            SectionOpen: self._on_open,
            SectionClose: self._on_close,
            SectionCloseAll: self._on_close_all,
            Authkey: self._on_authkey,
            Init: self._on_init,
            UpdateConfig: self._on_update,
            Invalid: self._on_invalid,
        }

    # ---- control channel (main thread, lock held) ----------------------------------------------------------

    def handle_control(self, msg: dict[str, Any]) -> None:
        op = msg.get("op")
        handler = getattr(self, f"op_{op}", None) if isinstance(op, str) else None
        if handler is None:
            raise ControlError(f"unknown op {op!r}")
        if op not in ("configure", "exit") and self.cfg is None:
            raise ControlError(f"{op}: send configure first")
        handler(msg)

    def op_configure(self, msg: dict[str, Any]) -> None:
        if self.cfg is not None:
            raise ControlError("configure: already configured")
        directory = check_private_dir(msg.get("dir"))
        given = msg.get("cfg") or {}
        if not isinstance(given, dict):
            raise ControlError("configure: cfg must be an object")
        cfg = {**replies.CONFIG_DEFAULTS, **given}  # absent keys: NVRx 0.4.1 defaults; null: disabled
        configured_timeouts(cfg)  # validate before committing
        try:
            replies.ft_config(cfg)
        except (KeyError, ValueError, TypeError) as exc:
            raise ControlError(f"configure: bad cfg: {exc}") from None
        steps = msg.get("steps") or {}
        if not isinstance(steps, dict):
            raise ControlError("configure: steps must be an object")
        initial = _timeout("steps.initial", steps.get("initial"))
        subsequent = _timeout("steps.subsequent", steps.get("subsequent"))
        interval = _timeout("steps.report_interval", steps.get("report_interval", 1.0))
        self.step_timeouts, self.report_interval = (initial, subsequent), interval or 1.0
        self.status_interval = _timeout("steps.status_interval", steps.get("status_interval")) or None
        if self.status_interval:
            self.status_at = self.clock() + self.status_interval
        self.dir, self.cfg = directory, cfg
        self.launcher_path = os.path.join(directory, "launcher.sock")
        self._listen(self.launcher_path, None)
        self.emit({"ev": "ready", "launcher_socket": self.launcher_path})

    def op_arm(self, msg: dict[str, Any]) -> None:
        local_rank = _int(msg, "local_rank")
        path = parse_socket_path(msg.get("socket"), self.dir)
        slot = self.slots.get(local_rank)
        if slot is None:
            assert self.cfg is not None
            slot = self.slots[local_rank] = Slot(local_rank, RankWatch(configured_timeouts(self.cfg)))
        for conn in list(slot.conns):
            self._drop(conn)
        if slot.listener is not None and slot.path != path:
            self._unlisten(slot)
        if slot.listener is None:
            slot.listener = self._listen(path, slot)
            slot.path = path
        slot.rank = _opt_int(msg, "rank")
        slot.pid, slot.pgid = _opt_int(msg, "pid"), _opt_int(msg, "pgid")
        slot.client_pid = None
        now = self.clock()
        slot.watch.arm(now)
        self._arm_steps(slot, msg.get("step_socket"), now)
        self.emit({"ev": "armed", "local_rank": local_rank})

    def op_pid(self, msg: dict[str, Any]) -> None:
        slot = self._slot(msg)
        slot.pid, slot.pgid = _opt_int(msg, "pid"), _opt_int(msg, "pgid")

    def op_disarm(self, msg: dict[str, Any]) -> None:
        slot = self._slot(msg)
        slot.watch.disarm()
        slot.steps.disarm()
        for conn in list(slot.conns):
            self._drop(conn)
        self.emit({"ev": "disarmed", "local_rank": slot.local_rank})

    def op_snapshot(self, msg: dict[str, Any]) -> None:
        now = self.clock()
        self.emit({"ev": "snapshot", "ranks": [self._describe(s, now) for _, s in sorted(self.slots.items())]})

    def op_exit(self, msg: dict[str, Any]) -> None:
        self.running = False

    def agent_gone(self) -> None:
        """stdin EOF: the agent died. Nothing else will stop the workers, so kill every armed group."""
        for slot in self.slots.values():
            if slot.watch.phase is Phase.DISARMED:
                continue
            try:
                if slot.pgid is not None:
                    os.killpg(slot.pgid, signal.SIGKILL)
                elif slot.pid is not None:
                    os.kill(slot.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass  # already gone
        self.running = False

    # ---- sockets -------------------------------------------------------------------------------------------

    def _listen(self, path: str, slot: Optional[Slot]) -> socket.socket:
        _unlink(path)  # a stale socket from an earlier monitor: the directory is private to the agent
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(path)
        os.chmod(path, 0o600)
        sock.listen(64)
        sock.setblocking(False)
        self.listeners[sock.fileno()] = (sock, slot)
        self.ep.register(sock.fileno(), select.EPOLLIN)
        return sock

    def _unlisten(self, slot: Slot) -> None:
        assert slot.listener is not None
        self.listeners.pop(slot.listener.fileno(), None)
        self.ep.unregister(slot.listener.fileno())
        slot.listener.close()
        _unlink(slot.path)
        slot.listener = None

    def _accept(self, listener: socket.socket, slot: Optional[Slot]) -> None:
        while True:
            try:
                sock, _ = listener.accept()
            except BlockingIOError:
                return
            uid = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))[1]
            if uid not in (0, os.geteuid()) or (slot is not None and slot.watch.phase is Phase.DISARMED):
                sock.close()
                continue
            sock.setblocking(True)
            conn = Conn(sock, slot)
            self.conns.add(conn)
            if slot is not None:
                slot.conns.add(conn)
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self.threads.add(thread)
            thread.start()

    def _detach(self, conn: Conn) -> bool:
        """Unlink ``conn`` from its slot (lock held); True if it was the rank's active client."""
        slot = conn.slot
        if slot is None:
            return False
        slot.conns.discard(conn)
        if slot.active is not conn:
            return False
        slot.active = None
        if slot.watch.phase is not Phase.DISARMED:
            slot.watch.disconnect()
        return True

    def _drop(self, conn: Conn) -> None:
        """Monitor-initiated close (lock held): detach now; shutdown wakes the thread, which closes."""
        if conn.dropped:
            return
        conn.dropped = True
        self._detach(conn)
        try:
            conn.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    # ---- connection threads ----------------------------------------------------------------------------------

    def _serve(self, conn: Conn) -> None:
        sock = conn.sock
        try:
            while True:
                # Exact reads (header, then payload) measured as fast as one big recv with
                # SO_RCVLOWAT, and a short garbage frame cannot leave us waiting for more bytes.
                header = sock.recv(4)
                if not header:
                    break
                if len(header) < 4:
                    header += _recv_exact(sock, 4 - len(header))
                reply = self._frame(conn, _recv_exact(sock, frame_length(header)))
                if reply is None:
                    break
                sock.sendall(reply)
        except ProtocolError as exc:
            with self.lock:
                where = f"local rank {conn.slot.local_rank}" if conn.slot else "launcher socket"
                self.emit({"ev": "error", "message": f"{where}: {exc}; connection dropped"})
        except (OSError, EOFError):
            pass
        finally:
            with self.lock:
                if not conn.dropped:
                    conn.dropped = True
                    if self._detach(conn) and conn.slot is not None:
                        self.emit({"ev": "disconnected", "local_rank": conn.slot.local_rank})
                self.conns.discard(conn)
                self.threads.discard(threading.current_thread())
            sock.close()

    def _frame(self, conn: Conn, payload: bytes) -> Optional[bytes]:
        slot = conn.slot
        if slot is None:
            req = decode_workload_request(payload)
            with self.lock:
                self.emit({"ev": "workload_request", "rank": req.rank, "action": req.action,
                           "description": req.description})
            return replies.WORKLOAD_OK_FRAME
        req = self.decoder.decode(payload)  # pure, outside the lock
        handler = self.handlers[type(req)]
        with self.lock:
            if conn.dropped:
                return None
            try:
                reply = handler(slot, conn, req)
            except (SectionError, InvalidTransition) as exc:
                reply = replies.frame(replies.error_msg(str(exc)))
            d = next_deadline(slot.watch)
            nc = self.next_check
            wake = d is not None and (nc is None or d < nc)
            if wake:
                self.next_check = d
        if wake:
            try:
                os.write(self.wake_w, b"\0")
            except BlockingIOError:
                pass  # the pipe is full of wake-ups already
        return reply

    # ---- requests (lock held): each returns the reply frame ------------------------------------------------

    def _on_heartbeat(self, slot: Slot, conn: Conn, req: Heartbeat) -> bytes:
        if slot.active is not conn:
            return _NOT_INITIALISED
        if slot.watch.heartbeat(self.clock()):
            self.emit({"ev": "first_heartbeat", "local_rank": slot.local_rank, "rank": slot.rank,
                       "t": round(self.clock() - slot.watch.armed_at, 6)})
        return replies.OK_FRAME

    def _on_open(self, slot: Slot, conn: Conn, req: SectionOpen) -> bytes:
        if slot.active is not conn:
            return _NOT_INITIALISED
        slot.watch.open_section(req.name, self.clock())
        return replies.OK_FRAME

    def _on_close(self, slot: Slot, conn: Conn, req: SectionClose) -> bytes:
        if slot.active is not conn:
            return _NOT_INITIALISED
        now = self.clock()
        slot.watch.close_section(req.name, now)
        if is_checkpoint_section(req.name):
            slot.steps.checkpoint_closed(now)
        return replies.OK_FRAME

    def _on_close_all(self, slot: Slot, conn: Conn, req: SectionCloseAll) -> bytes:
        if slot.active is not conn:
            return _NOT_INITIALISED
        slot.watch.close_all_sections(self.clock())
        return replies.OK_FRAME

    def _on_authkey(self, slot: Slot, conn: Conn, req: Authkey) -> bytes:
        # NVRx adopts the client's authkey so it can receive Managers and tensors; we accept neither.
        return replies.OK_FRAME

    def _on_init(self, slot: Slot, conn: Conn, req: Init) -> bytes:
        if slot.active is not None and slot.active is not conn:
            # A new client took over before the old one's EOF was seen: the newest owns the rank.
            self._drop(slot.active)
        slot.watch.init(self.clock())
        slot.steps.yield_to_client()  # the script heartbeats itself: no double heartbeats
        slot.active = conn
        slot.client_pid = req.pid
        if slot.rank is None:
            slot.rank = req.rank
        self.emit({"ev": "connected", "local_rank": slot.local_rank,
                   "rank": req.rank if req.rank is not None else slot.rank, "pid": req.pid})
        return replies.frame(replies.ok_msg(cfg=replies.ft_config(self._effective_cfg(slot))))

    def _on_update(self, slot: Slot, conn: Conn, req: UpdateConfig) -> bytes:
        if slot.active is not conn:
            return _NOT_INITIALISED
        hb, sec = req.hb, req.section
        slot.watch.update_timeouts(
            initial=hb.initial if hb else None,
            subsequent=hb.subsequent if hb else None,
            sections=sec.section if sec else None,
            out_of_section=sec.out_of_section if sec else None,
            update_hb=hb is not None,
            update_sections=sec is not None,
        )
        self.emit({
            "ev": "timeouts_updated",
            "local_rank": slot.local_rank,
            "hb": None if hb is None else {"initial": hb.initial, "subsequent": hb.subsequent,
                                           "were_calculated": hb.were_calculated},
            "section": None if sec is None else {
                "section": dict(sec.section),
                "out_of_section": sec.out_of_section,
                "calculated_sections": list(sec.calculated_sections),
                "is_out_of_section_calculated": sec.is_out_of_section_calculated,
            },
        })
        return replies.OK_FRAME

    def _on_invalid(self, slot: Slot, conn: Conn, req: Invalid) -> bytes:
        return replies.frame(replies.error_msg(req.cause))

    # ---- deadlines (lock held) ---------------------------------------------------------------------------

    def check_deadlines(self, now: float) -> None:
        earliest: Optional[float] = None
        for slot in self.slots.values():
            w = slot.watch
            verdict = next_verdict(w, now)
            if verdict is not None:
                self.emit({
                    "ev": "expired",
                    "local_rank": slot.local_rank,
                    "rank": slot.rank,
                    "pid": slot.pid if slot.pid is not None else slot.client_pid,
                    "kind": verdict.kind.value,
                    "section": verdict.section,
                    "timeout": verdict.timeout,
                    "elapsed": round(verdict.elapsed, 6),
                    "open_sections": list(w.open_sections),
                    "last_heartbeat_age": None if w.last_hb is None else round(now - w.last_hb, 6),
                    "monotonic": now,
                })
                w.expire()
                slot.steps.expire()  # one verdict per arm
            step = slot.steps.verdict(now)
            if step is not None:
                self.emit({
                    "ev": "expired", "local_rank": slot.local_rank, "rank": slot.rank,
                    "pid": slot.pid if slot.pid is not None else slot.client_pid, "kind": "step",
                    "section": None, "timeout": step[0], "elapsed": round(step[1], 6),
                    "open_sections": list(w.open_sections), "step": slot.steps.last_index,
                    "last_heartbeat_age": None if slot.steps.last_at is None else round(now - slot.steps.last_at, 6),
                    "monotonic": now,
                })
                slot.steps.expire()
                if w.phase is Phase.MONITORING:
                    w.expire()
            d = slot.deadline()
            if d is not None and (earliest is None or d < earliest):
                earliest = d
        self.next_check = earliest

    # ---- helpers -----------------------------------------------------------------------------------------

    def _slot(self, msg: dict[str, Any]) -> Slot:
        local_rank = _int(msg, "local_rank")
        slot = self.slots.get(local_rank)
        if slot is None:
            raise ControlError(f"local rank {local_rank} was never armed")
        return slot

    def _effective_cfg(self, slot: Slot) -> dict[str, Any]:
        # As NVRx: a client initialising after an update gets the updated timeouts in its config.
        assert self.cfg is not None
        t = slot.watch.timeouts
        return {**self.cfg, "initial_rank_heartbeat_timeout": t.initial, "rank_heartbeat_timeout": t.subsequent,
                "rank_section_timeouts": dict(t.sections), "rank_out_of_section_timeout": t.out_of_section}

    def _describe(self, slot: Slot, now: float) -> dict[str, Any]:
        w = slot.watch
        return {
            "local_rank": slot.local_rank,
            "rank": slot.rank,
            "pid": slot.pid,
            "state": w.phase.value,
            "connected": slot.active is not None,
            "last_heartbeat_age": None if w.last_hb is None else round(now - w.last_hb, 6),
            "open_sections": list(w.open_sections),
            "heartbeats": w.heartbeats,
            "timeouts": w.timeouts.as_dict(),
            "steps": slot.steps.steps,
            "step": slot.steps.last_index,
            "last_step_age": None if slot.steps.last_at is None else round(now - slot.steps.last_at, 6),
            "last_step_time": slot.steps.last_period,
            "step_deadline_enforced": slot.steps.armed and slot.steps.enforced,
            "first_step_at": slot.steps.first_at,
            "last_step_at": slot.steps.last_at,
            "checkpoint_at": slot.steps.checkpoint_at,
        }

    # ---- automatic step beats (main thread, lock held) ------------------------------------------------------

    def _arm_steps(self, slot: Slot, path: Any, now: float) -> None:
        if path is None:
            slot.steps.disarm()
            if slot.step_sock is not None:
                self._close_step_sock(slot)
            return
        path = parse_socket_path(path, self.dir)
        if slot.step_sock is not None and slot.step_path != path:
            self._close_step_sock(slot)
        if slot.step_sock is None:
            _unlink(path)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)
            sock.bind(path)
            os.chmod(path, 0o600)
            slot.step_sock, slot.step_path = sock, path
            self.step_socks[sock.fileno()] = slot
            self.ep.register(sock.fileno(), select.EPOLLIN)
        else:
            self._read_beats(slot, now, discard=True)  # beats of the previous worker
        slot.steps.initial, slot.steps.subsequent = self.step_timeouts
        slot.steps.arm(now)
        d = slot.steps.deadline
        if d is not None and (self.next_check is None or d < self.next_check):
            self.next_check = d

    def _close_step_sock(self, slot: Slot) -> None:
        assert slot.step_sock is not None
        self.step_socks.pop(slot.step_sock.fileno(), None)
        try:
            self.ep.unregister(slot.step_sock.fileno())
        except (OSError, ValueError):
            pass
        slot.step_sock.close()
        _unlink(slot.step_path)
        slot.step_sock, slot.step_path = None, ""

    def _read_beats(self, slot: Slot, now: float, discard: bool = False) -> None:
        sock = slot.step_sock
        assert sock is not None
        while True:
            try:
                data = sock.recv(64)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            if discard or len(data) != BEAT.size:
                continue
            index, period, cpu, flags = BEAT.unpack(data)
            if slot.steps.beat(now, index, period, cpu, flags):
                self.emit({"ev": "first_step", "local_rank": slot.local_rank, "rank": slot.rank,
                           "t": round(now - slot.steps.armed_at, 6), "monotonic": now})
                # the first step replaces the initial timeout with the (usually much shorter) step timeout
                d = slot.steps.deadline
                if d is not None and (self.next_check is None or d < self.next_check):
                    self.next_check = d
            if self.report_at is None:
                self.report_at = now + self.report_interval

    def report_steps(self) -> None:
        ranks = []
        for _, slot in sorted(self.slots.items()):
            report = slot.steps.take_report()
            if report is not None:
                ranks.append({"local_rank": slot.local_rank, "rank": slot.rank,
                              "nvrx_client": not slot.steps.enforced, **report})
        self.report_at = None
        if ranks:
            self.emit({"ev": "steps", "ranks": ranks})

    # ---- the main loop -----------------------------------------------------------------------------------

    def run(self, stdin_fd: int) -> None:
        reader = LineReader()
        self.ep.register(stdin_fd, select.EPOLLIN)
        clock = self.clock
        while self.running:
            nc = self.next_check  # a stale read is fine: writers that move it earlier also wake us
            for ra in (self.report_at, self.status_at):
                if ra is not None and (nc is None or ra < nc):
                    nc = ra
            timeout = -1.0 if nc is None else max(0.0, nc - clock())
            try:
                events = self.ep.poll(timeout)
            except InterruptedError:
                continue
            for fd, _ in events:
                if fd == self.wake_r:
                    _drain(fd)
                elif fd == stdin_fd:
                    self._control(stdin_fd, reader)
                elif fd in self.listeners:
                    with self.lock:
                        self._accept(*self.listeners[fd])
                elif fd in self.step_socks:
                    with self.lock:
                        self._read_beats(self.step_socks[fd], clock())
            with self.lock:
                nc = self.next_check
                if nc is not None:
                    now = clock()
                    if now >= nc:
                        self.check_deadlines(now)
                if self.report_at is not None and clock() >= self.report_at:
                    self.report_steps()
                if self.status_at is not None and clock() >= self.status_at:
                    self.status_at = clock() + self.status_interval
                    now = clock()
                    if self.slots:
                        self.emit({"ev": "status", "ranks": [self._describe(s, now) for _, s in sorted(self.slots.items())]})

    def _control(self, fd: int, reader: LineReader) -> None:
        data = os.read(fd, 1 << 16)
        with self.lock:
            if not data:
                self.ep.unregister(fd)
                self.agent_gone()
                return
            for msg in reader.feed(data):
                try:
                    if isinstance(msg, ControlError):
                        raise msg
                    self.handle_control(msg)
                except (ControlError, InvalidTransition, OSError) as exc:
                    op = msg.get("op") if isinstance(msg, dict) else None
                    self.emit({"ev": "error", "message": str(exc), "op": op})
                if not self.running:
                    return

    def close_all(self, join_timeout: float = 1.0) -> None:
        with self.lock:
            for conn in list(self.conns):
                self._drop(conn)
            for slot in self.slots.values():
                if slot.listener is not None:
                    self._unlisten(slot)
                if slot.step_sock is not None:
                    self._close_step_sock(slot)
            for fd, (sock, _) in list(self.listeners.items()):
                sock.close()
            self.listeners.clear()
            if self.launcher_path:
                _unlink(self.launcher_path)
            threads = list(self.threads)
        deadline = time.monotonic() + join_timeout
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self.ep.close()


_NOT_INITIALISED = replies.frame(replies.error_msg("not initialised: send InitMsg first"))


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


def _int(msg: dict[str, Any], key: str) -> int:
    value = msg.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ControlError(f"{msg.get('op')}: {key} must be an integer")
    return value


def _opt_int(msg: dict[str, Any], key: str) -> Optional[int]:
    return None if msg.get(key) is None else _int(msg, key)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def main() -> int:
    # The agent owns our lifetime (see the module docstring): job-wide signals must not end it.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_IGN)
    emitter = Emitter(sys.stdout.fileno())
    monitor = Monitor(emitter.emit)
    emitter.on_broken = monitor.agent_gone
    try:
        monitor.run(sys.stdin.fileno())
    finally:
        monitor.close_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
