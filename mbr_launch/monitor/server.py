"""The per-node rank monitor process: ``python -m mbr_launch.monitor.server``.

The agent drives it with JSON lines on stdin and reads JSON lines (events) from stdout; see
``control.py`` for the vocabulary. Workers' ``RankMonitorClient`` (NVRx 0.4.1, unchanged) connect to the
per-rank sockets the agent arms. One thread, one ``epoll`` loop: its timeout is the earliest rank
deadline, so an expiry is reported a millisecond or so after it happens instead of on a poll interval.

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
import time
from typing import Any, Callable, Optional

from . import replies
from .control import ControlError, Emitter, LineReader, check_private_dir, configured_timeouts, parse_socket_path
from .deadlines import InvalidTransition, Phase, RankWatch, SectionError, next_deadline, next_verdict
from .protocol import (
    HEADER,
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

_IN = select.EPOLLIN
_OUT = select.EPOLLOUT
_PEERCRED = struct.Struct("3i")
_RECV = 1 << 16


class Conn:
    __slots__ = ("sock", "fd", "slot", "buf", "out")

    def __init__(self, sock: socket.socket, slot: Optional["Slot"]) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.slot = slot  # None: a launcher-socket (workload request) connection
        self.buf = bytearray()
        self.out = b""


class Slot:
    """One local rank: its listening socket, its current client connection and its deadlines."""

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


class Monitor:
    def __init__(self, emit: Callable[[dict[str, Any]], None], clock: Callable[[], float] = time.monotonic) -> None:
        self.emit = emit
        self.clock = clock
        self.ep = select.epoll()
        self.cfg: Optional[dict[str, Any]] = None
        self.dir = ""
        self.slots: dict[int, Slot] = {}
        self.listeners: dict[int, tuple[socket.socket, Optional[Slot]]] = {}
        self.conns: dict[int, Conn] = {}
        self.launcher: Optional[socket.socket] = None
        self.decoder = Decoder()
        self.next_check: Optional[float] = None  # may be early (then we recompute), never late
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

    # ---- control channel ---------------------------------------------------------------------------------

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
        self.dir, self.cfg = directory, cfg
        path = os.path.join(directory, "launcher.sock")
        self.launcher = self._listen(path, None)
        self.emit({"ev": "ready", "launcher_socket": path})

    def op_arm(self, msg: dict[str, Any]) -> None:
        local_rank = _int(msg, "local_rank")
        path = parse_socket_path(msg.get("socket"), self.dir)
        slot = self.slots.get(local_rank)
        if slot is None:
            assert self.cfg is not None
            slot = self.slots[local_rank] = Slot(local_rank, RankWatch(configured_timeouts(self.cfg)))
        for conn in list(slot.conns):
            self._close(conn, notify=False)
        if slot.listener is not None and slot.path != path:
            self._unlisten(slot)
        if slot.listener is None:
            slot.listener = self._listen(path, slot)
            slot.path = path
        slot.rank = _opt_int(msg, "rank")
        slot.pid, slot.pgid = _opt_int(msg, "pid"), _opt_int(msg, "pgid")
        slot.client_pid = None
        slot.watch.arm(self.clock())
        self.emit({"ev": "armed", "local_rank": local_rank})

    def op_pid(self, msg: dict[str, Any]) -> None:
        slot = self._slot(msg)
        slot.pid, slot.pgid = _opt_int(msg, "pid"), _opt_int(msg, "pgid")

    def op_disarm(self, msg: dict[str, Any]) -> None:
        slot = self._slot(msg)
        slot.watch.disarm()
        for conn in list(slot.conns):
            self._close(conn, notify=False)
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

    # ---- rank sockets --------------------------------------------------------------------------------------

    def _listen(self, path: str, slot: Optional[Slot]) -> socket.socket:
        try:
            os.unlink(path)  # a stale socket from a previous monitor; the directory is ours alone
        except FileNotFoundError:
            pass
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(path)
        os.chmod(path, 0o600)
        sock.listen(64)
        sock.setblocking(False)
        self.listeners[sock.fileno()] = (sock, slot)
        self.ep.register(sock.fileno(), _IN)
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
            if (uid not in (0, os.geteuid())) or (slot is not None and slot.watch.phase is Phase.DISARMED):
                sock.close()
                continue
            sock.setblocking(False)
            conn = Conn(sock, slot)
            self.conns[conn.fd] = conn
            if slot is not None:
                slot.conns.add(conn)
            self.ep.register(conn.fd, _IN)

    def _close(self, conn: Conn, *, notify: bool) -> None:
        if self.conns.pop(conn.fd, None) is None:
            return
        self.ep.unregister(conn.fd)
        conn.sock.close()
        slot = conn.slot
        if slot is None:
            return
        slot.conns.discard(conn)
        if slot.active is conn:
            slot.active = None
            if slot.watch.phase is not Phase.DISARMED:
                slot.watch.disconnect()
            if notify:
                self.emit({"ev": "disconnected", "local_rank": slot.local_rank})

    def _readable(self, conn: Conn) -> None:
        try:
            data = conn.sock.recv(_RECV)
        except (ConnectionResetError, BlockingIOError) as exc:
            if isinstance(exc, BlockingIOError):
                return
            data = b""
        if not data:
            self._close(conn, notify=True)
            return
        buf = conn.buf
        try:
            if not buf and len(data) > 4 and HEADER.unpack_from(data)[0] == len(data) - 4:
                self._frame(conn, data[4:])  # the common case: exactly one whole frame
                return
            buf += data
            while len(buf) >= 4:
                n = frame_length(bytes(buf[:4]))
                if len(buf) < 4 + n:
                    break
                payload = bytes(buf[4 : 4 + n])
                del buf[: 4 + n]
                self._frame(conn, payload)
                if conn.fd not in self.conns:
                    return
        except ProtocolError as exc:
            where = f"local rank {conn.slot.local_rank}" if conn.slot else "launcher socket"
            self.emit({"ev": "error", "message": f"{where}: {exc}; connection dropped"})
            self._close(conn, notify=True)

    def _frame(self, conn: Conn, payload: bytes) -> None:
        slot = conn.slot
        if slot is None:
            req = decode_workload_request(payload)
            self.emit({"ev": "workload_request", "rank": req.rank, "action": req.action, "description": req.description})
            self._send(conn, replies.WORKLOAD_OK_FRAME)
            return
        req = self.decoder.decode(payload)
        try:
            reply = self.handlers[type(req)](slot, conn, req)
        except (SectionError, InvalidTransition) as exc:
            reply = replies.frame(replies.error_msg(str(exc)))
        self._send(conn, reply)
        d = next_deadline(slot.watch)
        if d is not None and (self.next_check is None or d < self.next_check):
            self.next_check = d

    def _send(self, conn: Conn, data: bytes) -> None:
        if conn.out:
            conn.out += data
            return
        try:
            sent = conn.sock.send(data)
        except BlockingIOError:
            sent = 0
        except OSError:
            self._close(conn, notify=True)
            return
        if sent < len(data):
            conn.out = data[sent:]
            self.ep.modify(conn.fd, _IN | _OUT)

    def _writable(self, conn: Conn) -> None:
        try:
            sent = conn.sock.send(conn.out)
        except BlockingIOError:
            return
        except OSError:
            self._close(conn, notify=True)
            return
        conn.out = conn.out[sent:]
        if not conn.out:
            self.ep.modify(conn.fd, _IN)

    # ---- requests: each returns the reply frame ----------------------------------------------------------

    def _on_heartbeat(self, slot: Slot, conn: Conn, req: Heartbeat) -> bytes:
        if slot.active is not conn:
            return _not_initialised()
        if slot.watch.heartbeat(self.clock()):
            self.emit({"ev": "first_heartbeat", "local_rank": slot.local_rank, "rank": slot.rank,
                       "t": round(self.clock() - slot.watch.armed_at, 6)})
        return replies.OK_FRAME

    def _on_open(self, slot: Slot, conn: Conn, req: SectionOpen) -> bytes:
        if slot.active is not conn:
            return _not_initialised()
        slot.watch.open_section(req.name, self.clock())
        return replies.OK_FRAME

    def _on_close(self, slot: Slot, conn: Conn, req: SectionClose) -> bytes:
        if slot.active is not conn:
            return _not_initialised()
        slot.watch.close_section(req.name, self.clock())
        return replies.OK_FRAME

    def _on_close_all(self, slot: Slot, conn: Conn, req: SectionCloseAll) -> bytes:
        if slot.active is not conn:
            return _not_initialised()
        slot.watch.close_all_sections(self.clock())
        return replies.OK_FRAME

    def _on_authkey(self, slot: Slot, conn: Conn, req: Authkey) -> bytes:
        # NVRx adopts the client's authkey to receive Managers and tensors; we accept neither.
        return replies.OK_FRAME

    def _on_init(self, slot: Slot, conn: Conn, req: Init) -> bytes:
        if slot.active is not None and slot.active is not conn:
            # A new client took over (the old one's EOF may not be processed yet): it owns the rank now.
            old, slot.active = slot.active, None
            slot.conns.discard(old)
            old.slot = None
            self._close(old, notify=False)
            if slot.watch.phase is Phase.MONITORING:
                slot.watch.disconnect()
        slot.watch.init(self.clock())
        slot.active = conn
        slot.client_pid = req.pid
        if slot.rank is None:
            slot.rank = req.rank
        self.emit({"ev": "connected", "local_rank": slot.local_rank, "rank": req.rank if req.rank is not None else slot.rank,
                   "pid": req.pid})
        return replies.frame(replies.ok_msg(cfg=replies.ft_config(self._effective_cfg(slot))))

    def _on_update(self, slot: Slot, conn: Conn, req: UpdateConfig) -> bytes:
        if slot.active is not conn:
            return _not_initialised()
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

    # ---- deadlines ---------------------------------------------------------------------------------------

    def check_deadlines(self, now: float) -> None:
        earliest: Optional[float] = None
        for slot in self.slots.values():
            verdict = next_verdict(slot.watch, now)
            if verdict is not None:
                w = slot.watch
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
            d = next_deadline(slot.watch)
            if d is not None and (earliest is None or d < earliest):
                earliest = d
        self.next_check = earliest

    # ---- helpers -------------------------------------------------------------------------------------------

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
        }

    def close_all(self) -> None:
        for conn in list(self.conns.values()):
            self._close(conn, notify=False)
        for slot in self.slots.values():
            if slot.listener is not None:
                self._unlisten(slot)
        if self.launcher is not None:
            self.launcher.close()
            _unlink(os.path.join(self.dir, "launcher.sock"))
        self.ep.close()

    # ---- the loop ------------------------------------------------------------------------------------------

    def run(self, stdin_fd: int) -> None:
        reader = LineReader()
        self.ep.register(stdin_fd, _IN)
        conns, listeners, clock = self.conns, self.listeners, self.clock
        while self.running:
            nc = self.next_check
            timeout = -1.0 if nc is None else max(0.0, nc - clock())
            try:
                events = self.ep.poll(timeout)
            except InterruptedError:
                continue
            for fd, mask in events:
                conn = conns.get(fd)
                if conn is not None:
                    if mask & _OUT and conn.out:
                        self._writable(conn)
                    if mask & (_IN | select.EPOLLHUP | select.EPOLLERR) and fd in conns:
                        self._readable(conn)
                elif fd == stdin_fd:
                    self._control(stdin_fd, reader)
                elif fd in listeners:
                    self._accept(*listeners[fd])
            nc = self.next_check
            if nc is not None:
                now = clock()
                if now >= nc:
                    self.check_deadlines(now)

    def _control(self, fd: int, reader: LineReader) -> None:
        data = os.read(fd, 1 << 16)
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
                self.emit({"ev": "error", "message": str(exc), "op": msg.get("op") if isinstance(msg, dict) else None})
            if not self.running:
                return


def _not_initialised() -> bytes:
    return replies.frame(replies.error_msg("not initialised: send InitMsg first"))


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
    # See the module docstring: the agent owns our lifetime, job-wide signals must not end it.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_IGN)
    emitter = Emitter(1)
    monitor = Monitor(emitter.emit)
    emitter.on_broken = monitor.agent_gone
    try:
        monitor.run(sys.stdin.fileno())
    finally:
        monitor.close_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
