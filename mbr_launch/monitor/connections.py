"""Client connections: one thread per connection, and the handling of each NVRx request kind.

A blocking thread per connection is cheaper per round trip than one epoll loop. Frames are read in chunks
(a burst costs one ``recv``) and decoded outside the lock; handlers run with ``Shared.lock`` held and return
the reply frame, or ``NO_REPLY`` to a client that reads none (NVRx 0.6+ ``skip_section_response``). A thread
wakes the main thread only when it makes a deadline earlier.
"""

from __future__ import annotations

import os
import socket
import threading
from typing import Any, Callable, Iterator, Optional

from mbr_launch.monitor import replies
from mbr_launch.monitor.ancestry import descends_from, peer_of
from mbr_launch.monitor.control import configured_timeouts
from mbr_launch.monitor.deadlines import InvalidTransition, Phase, SectionError, next_deadline
from mbr_launch.monitor.protocol import (HEADER, Authkey, BadRequest, Decoder, Heartbeat, Init, Invalid,
                                         ProtocolError, SectionClose, SectionCloseAll, SectionOpen, UpdateConfig,
                                         V041, decode_workload_request, frame_length)
from mbr_launch.monitor.state import Conn, Shared, Slot, first_progress, timeouts_updated
from mbr_launch.monitor.steps import HEARTBEAT, ITERATION, is_checkpoint_section
from mbr_launch.monitor.wire import MonitorEvent

# How long a connection that came before the agent named the worker's pid waits for it.
PID_WAIT = 5.0
CHUNK = 64 * 1024
_NOT_INITIALISED = replies.frame(replies.error_msg("not initialised: send InitMsg first"))
NO_REPLY = b""  # a handler's answer to a client that reads no reply
_ONEWAY = (Heartbeat, SectionOpen, SectionClose, SectionCloseAll)  # a quiet client reads no reply to these
_IN_SESSION = (*_ONEWAY, UpdateConfig)  # answered with _NOT_INITIALISED but from the client that sent InitMsg

Handler = Callable[[Slot, Conn, Any], bytes]


def _ok(conn: Conn) -> bytes:
    return NO_REPLY if conn.quiet else replies.OK_FRAME


class Connections:
    def __init__(self, shared: Shared) -> None:
        self.shared = shared
        self.conns: set[Conn] = set()
        self.threads: set[threading.Thread] = set()
        self.decoder = Decoder()
        self.handlers: dict[type, Handler] = {
            Heartbeat: self._on_heartbeat,
            SectionOpen: self._on_open,
            SectionClose: self._on_close,
            SectionCloseAll: self._on_close_all,
            # NVRx adopts the client's authkey so it can receive Managers and tensors; we accept neither.
            Authkey: lambda slot, conn, req: replies.OK_FRAME,
            Init: self._on_init,
            UpdateConfig: self._on_update,
            Invalid: lambda slot, conn, req: self._refuse(slot, conn, req.cause, oneway=req.oneway),
        }

    # ---- main thread, lock held ----------------------------------------------------------------------------

    def accept(self, listener: socket.socket, slot: Optional[Slot]) -> None:
        while True:
            try:
                sock, _ = listener.accept()
            except BlockingIOError:
                return
            pid, uid = peer_of(sock)
            if uid not in (0, os.geteuid()) or (slot is not None and slot.watch.phase is Phase.DISARMED):
                sock.close()
                continue
            sock.setblocking(True)
            conn = Conn(sock, slot, pid)
            self.conns.add(conn)
            if slot is not None:
                slot.conns.add(conn)
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self.threads.add(thread)
            thread.start()

    def drop(self, conn: Conn) -> None:
        """Monitor-initiated close (lock held): detach now; shutdown wakes the thread, which closes."""
        if conn.dropped:
            return
        conn.dropped = True
        self._detach(conn)
        self.shared.pids_known.notify_all()  # a thread still waiting to admit it gives up now
        try:
            conn.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def drop_slot(self, slot: Slot) -> None:
        for conn in list(slot.conns):
            self.drop(conn)

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

    # ---- connection threads --------------------------------------------------------------------------------

    def _serve(self, conn: Conn) -> None:
        shared, sock = self.shared, conn.sock
        try:
            if not self._admit(conn):
                return
            for payload in frames(sock):
                reply = self._frame(conn, payload)
                if reply is None:
                    break
                if reply:
                    sock.sendall(reply)
        except ProtocolError as exc:
            self._error(conn, f"{exc}; connection dropped")
        except (OSError, EOFError):
            pass
        except Exception as exc:  # a bug of ours: reported as an event, never a traceback on the console
            self._error(conn, f"internal error {type(exc).__name__}: {exc}; connection dropped")
        finally:
            with shared.lock:
                if not conn.dropped:
                    conn.dropped = True
                    if self._detach(conn) and conn.slot is not None:
                        shared.emit({"ev": MonitorEvent.DISCONNECTED, "local_rank": conn.slot.local_rank})
                self.conns.discard(conn)
                self.threads.discard(threading.current_thread())
            sock.close()

    def _error(self, conn: Conn, message: str) -> None:
        """Report a refused or broken connection: an ``error`` event the agent records."""
        slot = conn.slot
        where = f"local rank {slot.local_rank}" if slot else "launcher socket"
        with self.shared.lock:
            self.shared.emit({"ev": MonitorEvent.ERROR, "local_rank": slot.local_rank if slot else None,
                              "pid": conn.peer_pid, "message": f"{where}: {message}"})

    def _admit(self, conn: Conn) -> bool:
        """Serve only the slot's (launcher socket: any armed slot's) worker or descendants, by the kernel's word."""
        shared = self.shared
        with shared.lock:
            shared.pids_known.wait_for(lambda: conn.dropped or bool(self._owners(conn.slot)), PID_WAIT)
            owners = self._owners(conn.slot)
            if conn.dropped:
                return False
        if descends_from(conn.peer_pid, owners):
            return True
        whose = f"the worker (pid {', '.join(map(str, sorted(owners)))})" if owners else "a worker (none armed)"
        self._error(conn, f"refused a connection from pid {conn.peer_pid}: it is not {whose} or one of its "
                          "descendants")
        return False

    def _owners(self, slot: Optional[Slot]) -> set[int]:
        if slot is not None:
            return {slot.pid} if slot.pid is not None else set()
        return {s.pid for s in self.shared.slots.values() if s.pid is not None and s.watch.phase is not Phase.DISARMED}

    def _frame(self, conn: Conn, payload: bytes) -> Optional[bytes]:
        shared, slot = self.shared, conn.slot
        if slot is None:
            try:
                work = decode_workload_request(payload)
            except BadRequest as exc:
                self._error(conn, f"refused a workload request: {exc}")
                return replies.frame(replies.dumps(f"refused: {exc}".encode()))
            with shared.lock:
                shared.emit({"ev": MonitorEvent.WORKLOAD_REQUEST, "rank": work.rank, "action": work.action,
                             "description": work.description})
            return replies.WORKLOAD_OK_FRAME
        req = self.decoder.decode(payload)  # pure, outside the lock
        handler = self.handlers[type(req)]
        with shared.lock:
            if conn.dropped:
                return None
            if isinstance(req, _IN_SESSION) and slot.active is not conn:
                reply = _NOT_INITIALISED
            else:
                try:
                    reply = handler(slot, conn, req)
                except (SectionError, InvalidTransition) as exc:
                    reply = self._refuse(slot, conn, str(exc), oneway=isinstance(req, _ONEWAY))
            wake = shared.check_by(next_deadline(slot.watch))
        if wake:
            shared.wake()
        return reply

    # ---- requests (lock held): each returns the reply frame ------------------------------------------------

    def _on_heartbeat(self, slot: Slot, conn: Conn, req: Heartbeat) -> bytes:
        clock = self.shared.clock
        now = clock()
        if slot.watch.heartbeat(now):
            slot.steps.note_progress(HEARTBEAT, now)  # first_heartbeat tells the agent
            self.shared.emit({"ev": MonitorEvent.FIRST_HEARTBEAT, "local_rank": slot.local_rank, "rank": slot.rank,
                              "t": round(clock() - slot.watch.armed_at, 6)})
        return _ok(conn)

    def _on_open(self, slot: Slot, conn: Conn, req: SectionOpen) -> bytes:
        now = self.shared.clock()
        slot.watch.open_section(req.name, now, req.iteration)
        if slot.steps.progress is None and req.iteration is not None:
            self._iteration_progress(slot, now)
        return _ok(conn)

    def _on_close(self, slot: Slot, conn: Conn, req: SectionClose) -> bytes:
        now = self.shared.clock()
        slot.watch.close_section(req.name, now, req.iteration)
        if is_checkpoint_section(req.name):
            # For goodput only: a checkpoint* section may be the load at start-up, so no sign of progress.
            slot.steps.checkpoint_closed(now)
        if slot.steps.progress is None and req.iteration is not None:
            self._iteration_progress(slot, now)
        return _ok(conn)

    def _iteration_progress(self, slot: Slot, now: float) -> None:
        """The iteration an NVRx 0.6+ client reports has advanced past the session's first: it trains."""
        w = slot.watch
        if (w.first_iteration is not None and w.iteration is not None and w.iteration > w.first_iteration
                and slot.steps.note_progress(ITERATION, now)):
            self.shared.emit(first_progress(slot, ITERATION, now))

    def _on_close_all(self, slot: Slot, conn: Conn, req: SectionCloseAll) -> bytes:
        slot.watch.close_all_sections(self.shared.clock())
        return _ok(conn)

    def _on_init(self, slot: Slot, conn: Conn, req: Init) -> bytes:
        if slot.active is not None and slot.active is not conn:
            # A new client took over before the old one's EOF was seen: the newest owns the rank.
            self.drop(slot.active)
        version = req.version
        assert self.shared.cfg is not None
        base = replies.client_config(self.shared.cfg, version)
        newer = version != V041
        warmup = req.num_warmup_iters if req.num_warmup_iters is not None else base.get("num_warmup_iterations", 5)
        slot.watch.init(self.shared.clock(), newer=newer, warmup_iterations=int(warmup),
                        timeouts=configured_timeouts(base))
        slot.steps.yield_to_client()  # the script heartbeats itself: no double heartbeats
        slot.active = conn
        slot.client_pid = conn.peer_pid or req.pid  # the kernel's word over the client's
        slot.client_version = version
        conn.quiet = newer and base.get("skip_section_response") is True
        if slot.rank is None:
            slot.rank = req.rank
        self.shared.emit({"ev": MonitorEvent.CONNECTED, "local_rank": slot.local_rank, "rank": req.rank,
                          "pid": slot.client_pid, "nvrx": version, "iteration": req.iteration,
                          "replies": not conn.quiet})
        cfg = replies.ft_config(self.shared.effective_cfg(slot, version), version)
        return replies.frame(replies.ok_msg(cfg=cfg))

    def _on_update(self, slot: Slot, conn: Conn, req: UpdateConfig) -> bytes:
        hb, sec = req.hb, req.section
        slot.watch.update_timeouts(
            initial=hb.initial if hb else None,
            subsequent=hb.subsequent if hb else None,
            sections=sec.section if sec else None,
            out_of_section=sec.out_of_section if sec else None,
            update_hb=hb is not None,
            update_sections=sec is not None,
        )
        self.shared.emit(timeouts_updated(slot, req))
        return replies.OK_FRAME

    def _refuse(self, slot: Slot, conn: Conn, cause: str, *, oneway: bool = False) -> bytes:
        """Report ``cause`` to the agent; answer ``ErrorMsg(cause)`` unless ``oneway`` on a quiet connection."""
        self.shared.emit({"ev": MonitorEvent.ERROR, "local_rank": slot.local_rank, "pid": conn.peer_pid,
                          "message": f"local rank {slot.local_rank}: refused a request: {cause}"})
        if oneway and conn.quiet:
            return NO_REPLY
        return replies.frame(replies.error_msg(cause))


def frames(sock: socket.socket) -> Iterator[bytes]:
    """Each frame's payload until the peer closes between frames (``EOFError`` inside one)."""
    buf = bytearray()
    start = 0  # where the next frame begins in ``buf``
    while True:
        while len(buf) - start < HEADER.size:
            if not _fill(sock, buf, at_boundary=len(buf) == start):
                return
        end = start + HEADER.size + frame_length(bytes(buf[start:start + HEADER.size]))
        while len(buf) < end:
            _fill(sock, buf, at_boundary=False)
        yield bytes(buf[start + HEADER.size:end])
        start = end
        if start == len(buf):
            buf.clear()
            start = 0
        elif start >= CHUNK:  # keep the unread tail only: the buffer stays about a chunk long
            del buf[:start]
            start = 0


def _fill(sock: socket.socket, buf: bytearray, *, at_boundary: bool) -> bool:
    """Append what the socket has (waiting for at least a byte); False at a clean end of the stream."""
    data = sock.recv(CHUNK)
    if not data:
        if at_boundary:
            return False
        raise EOFError
    buf += data
    return True
