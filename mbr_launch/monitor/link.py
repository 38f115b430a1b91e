"""The agent's end of the rank monitor process, forked from the launcher where safe, else a new interpreter.

Commands go down its stdin; replies are waited for here; other events go to ``on_event`` from a reader thread
(the callback must only enqueue). A fork (``fork_monitor``) shares what the launcher has imported, where a new
``python -S`` pays its start-up again; it is taken only while the launcher runs a single thread (``api.launch``
forks before its threads start). The child shows as ``mbr_launch.monitor.server: rank monitor of mbr-launch
PID``, thread name ``mbr-monitor``.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, BinaryIO, Callable

from mbr_launch import procstat
from mbr_launch.forking import close_from, fork_launcher
from mbr_launch.monitor import witness
from mbr_launch.monitor.wire import SERVER_MODULE, MonitorEvent, Op


class MonitorError(RuntimeError):
    pass


# How many times its timeout a monitor that is busy or starved of CPU is waited for (``MonitorLink._wait``).
STARVED_WAIT_FACTOR = 12


# The replies the agent waits for (a failed command's ``error`` event reaches the waiter instead, at once).
_REPLY_OF = {Op.CONFIGURE: MonitorEvent.READY, Op.ARM: MonitorEvent.ARMED, Op.SNAPSHOT: MonitorEvent.SNAPSHOT}
_GONE = "_gone"  # put in every reply queue when the monitor's stdout ends: nothing will answer any more


class MonitorLink:
    def __init__(self, on_event: Callable[[dict[str, Any]], None] | None = None, *,
                 env: dict[str, str] | None = None) -> None:
        self.on_event = on_event  # set before ``start`` (an early link gets it when the agent adopts it)
        self._env = env
        self._proc: subprocess.Popen | Forked | None = None
        self._replies: dict[str, queue.SimpleQueue] = {name: queue.SimpleQueue() for name in _REPLY_OF.values()}
        self._write_lock = threading.Lock()
        self.pidfd: int | None = None
        self.launcher_socket: str | None = None
        self._listening: set[str] = set()  # the rank sockets this monitor armed (it keeps listening on them)
        self._unconfirmed: list[float] = []  # the timeouts of the 'armed' replies ``arm`` left unread

    def spawn(self, *, fork: bool = False) -> "MonitorLink":
        """Start the monitor's process, which waits for ``start``'s configuration; early (``api.launch``), so its
        start-up overlaps the agent's. ``fork``: fork this process where safe (``fork_monitor``)."""
        if self._proc is not None:
            return self
        self._proc = (fork_monitor() if fork else None) or self._new_interpreter()
        self.pidfd = os.pidfd_open(self._proc.pid)
        return self

    def _new_interpreter(self) -> subprocess.Popen:
        # ``python -S``: no site initialisation (``.pth`` files that import cost CPU), so the package is named.
        env = dict(os.environ if self._env is None else self._env)
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
        # No parent-death signal: on stdin EOF the monitor kills every armed worker's process group first.
        return subprocess.Popen([sys.executable, "-S", "-m", SERVER_MODULE], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, env=env, start_new_session=True)

    def start(self, sock_dir: Path, cfg: dict[str, Any], timeout: float = 30.0, *,
              steps: dict[str, Any] | None = None) -> None:
        self.spawn()
        threading.Thread(target=self._read, daemon=True, name="monitor-events").start()
        self._send({"op": Op.CONFIGURE, "dir": str(sock_dir), "cfg": cfg, "steps": steps or {}})
        ready = self._wait(MonitorEvent.READY, timeout)
        self.launcher_socket = ready.get("launcher_socket")

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def exit_code(self) -> int | None:
        return self._proc.poll() if self._proc else None

    def pending_signals(self) -> frozenset[int] | None:
        """The job's signals sent to the monitor's process (``monitor.witness``); None without one."""
        return witness.pending(self._proc.pid) if self._proc and self._proc.returncode is None else None

    def arm(self, *, local_rank: int, rank: int, socket: str, timeout: float = 10.0,
            step_socket: str | None = None) -> None:
        """Arm a rank before its worker starts; on a socket already listened on, the reply is left for
        ``confirm_armed`` (the monitor reads commands before connections: ``server.MonitorServer.run``)."""
        self._send({"op": Op.ARM, "local_rank": local_rank, "rank": rank, "pid": None, "pgid": None,
                    "socket": socket, **({"step_socket": step_socket} if step_socket else {})})
        if socket in self._listening:
            self._unconfirmed.append(timeout)
            return
        self._wait(MonitorEvent.ARMED, timeout)
        self._listening.add(socket)

    def confirm_armed(self) -> None:
        """Wait for the replies ``arm`` left (a refusal raises here, after the worker started)."""
        while self._unconfirmed:
            self._wait(MonitorEvent.ARMED, self._unconfirmed.pop(0))

    def set_pid(self, *, local_rank: int, pid: int) -> None:
        self._send({"op": Op.PID, "local_rank": local_rank, "pid": pid, "pgid": pid})

    def disarm(self, local_rank: int) -> None:
        self._send({"op": Op.DISARM, "local_rank": local_rank})

    def snapshot(self, timeout: float = 2.0) -> dict[str, Any]:
        self._send({"op": Op.SNAPSHOT})
        return self._wait(MonitorEvent.SNAPSHOT, timeout)

    def close(self, timeout: float = 5.0) -> None:
        if not self._proc:
            return
        try:
            self._send({"op": Op.EXIT})
        except MonitorError:
            pass
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None

    # -- plumbing ---------------------------------------------------------------------------------

    def _send(self, command: dict[str, Any]) -> None:
        assert self._proc and self._proc.stdin
        data = (json.dumps(command) + "\n").encode()
        with self._write_lock:
            try:
                self._proc.stdin.write(data)
                self._proc.stdin.flush()
            except (BrokenPipeError, ValueError, OSError) as err:
                raise MonitorError(f"rank monitor is gone: {err}") from None

    def _wait(self, name: str, timeout: float) -> dict[str, Any]:
        """The monitor's reply ``name``, waited for ``timeout`` while it is idle; a monitor starved of CPU
        (runnable, or using CPU since the last look) up to ``STARVED_WAIT_FACTOR`` times as long."""
        stat = self._stat()
        for _ in range(STARVED_WAIT_FACTOR):
            try:
                reply = self._replies[name].get(timeout=timeout)
                break
            except queue.Empty:
                before, stat = stat, self._stat()
                if stat is None or stat.zombie or (stat.state != "R" and before is not None
                                                   and stat.cpu_ticks == before.cpu_ticks):
                    raise MonitorError(f"rank monitor did not answer '{name}' within {timeout:.0f} s (idle, "
                                       "not starved)") from None
        else:
            raise MonitorError(f"rank monitor did not answer '{name}' within {timeout * STARVED_WAIT_FACTOR:.0f} s"
                               " (busy or starved of CPU all along)")
        if reply.get("ev") == MonitorEvent.ERROR:
            raise MonitorError(f"rank monitor refused '{reply.get('op')}': {reply.get('message')}")
        if reply.get("ev") == _GONE:
            try:
                code = self._proc.wait(2) if self._proc else None
            except subprocess.TimeoutExpired:
                code = None  # its stdout closed but it lingers: close() kills it
            raise MonitorError(f"rank monitor exited (exit code {code}) before answering '{name}'")
        return reply

    def _stat(self) -> procstat.Stat | None:
        return procstat.read(self.pid) if self.pid else None

    def _read(self) -> None:
        assert self._proc and self._proc.stdout
        for raw in iter(self._proc.stdout.readline, b""):
            try:
                event = json.loads(raw)
            except ValueError:
                continue
            if not isinstance(event, dict):
                continue
            name = event.get("ev")
            if name == MonitorEvent.ERROR and event.get("op") in _REPLY_OF:
                name = _REPLY_OF[event["op"]]
            if name in self._replies:
                self._replies[name].put(event)
            elif self.on_event is not None:
                self.on_event(event)
        for replies in self._replies.values():
            replies.put({"ev": _GONE})


# ---- the forked monitor ------------------------------------------------------------------------------------

COMM = b"mbr-monitor"  # the child's thread name (at most 15 bytes)


class Forked:
    """The part of ``subprocess.Popen`` that ``MonitorLink`` uses, for a child this process forked."""

    def __init__(self, pid: int, stdin: BinaryIO, stdout: BinaryIO) -> None:
        self.pid = pid
        self.stdin = stdin
        self.stdout = stdout
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: it is gone, its status is not ours to know
                self.returncode = -1
                return self.returncode
            if pid == self.pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(SERVER_MODULE, timeout or 0.0)
            time.sleep(0.01)
        return code

    def kill(self) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def fork_monitor() -> Forked | None:
    """Fork the rank monitor; None where a fork is not safe here (more than one thread, or no ``os.fork``)."""
    commands_r, commands_w = os.pipe()
    events_r, events_w = os.pipe()
    launcher = os.getpid()
    pid = fork_launcher()
    if pid is None:
        for fd in (commands_r, commands_w, events_r, events_w):
            os.close(fd)
        return None
    if pid == 0:
        _child(commands_r, events_w, launcher)  # never returns
    os.close(commands_r)
    os.close(events_w)
    return Forked(pid, os.fdopen(commands_w, "wb"), os.fdopen(events_r, "rb"))


def _child(commands: int, events: int, launcher: int) -> None:
    code = 1
    try:
        os.setsid()  # as start_new_session: a Ctrl-C to the launcher's group does not reach the monitor
        os.dup2(commands, 0)
        os.dup2(events, 1)
        close_from(3)  # the launcher's ends of both pipes included: its death must read as EOF here
        from mbr_launch.shim.proctitle import retitle, set_name

        if retitle(f"{SERVER_MODULE}: rank monitor of mbr-launch {launcher}", name=COMM) is None:
            set_name(COMM)  # no title (no /proc/self/mem here): the name still tells it from the launcher
        from mbr_launch.monitor import server
        from mbr_launch.gcpause import resume_gc

        resume_gc()  # the launcher paused the collector for its imports; this process runs for days
        code = server.main()
    except BaseException:  # noqa: BLE001 - the child must end here, never return into the launcher's code
        try:
            import traceback

            traceback.print_exc()
        except BaseException:  # noqa: BLE001
            pass
    finally:
        os._exit(code)
