"""The fork server: a copy of the launcher with torch imported, from which workers are forked (why:
docs/performance.md, "Workers forked, not started").

Forked while the launcher runs one thread, it imports the ``--standby-preload`` modules once, then only forks
(``spawn``) and reaps (``wait``, asked once the worker's pidfd says it ended, so it never blocks) over a private
socket pair (length-prefixed JSON, descriptors by ``SCM_RIGHTS``). It ignores the signals Slurm sends every
process of a step and dies with the launcher; where it is gone the pool starts fresh interpreters.
"""

from __future__ import annotations

import array
import io
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from typing import Any, Mapping, Sequence

from mbr_launch import outside
from mbr_launch.contract import BOOT_MODULE, preemption_signals
from mbr_launch.fdwait import ready
from mbr_launch.forking import close_from, fork_launcher

_HEADER = struct.Struct("!I")
MAX_MESSAGE = 16 << 20  # bytes: a worker's environment and command line, with room
MAX_FDS = 16
# Read when the interpreter starts or torch is imported: a forked worker gets the launcher's values of these.
_IMPORT_TIME = ("OMP_", "MKL_", "KMP_", "GOMP_", "OPENBLAS_", "TORCH", "PYTORCH_", "PYTHON", "LD_", "MALLOC_",
                "GLIBC_TUNABLES", "NUMEXPR_", "CUDA_MODULE_LOADING")
# ... except these: read later, set again in the child (``shim.forkchild``), or the agent's only.
_NOT_AT_IMPORT = ("TORCH_NCCL_", "TORCH_DISTRIBUTED_", "TORCHELASTIC_", "PYTORCH_CUDA_ALLOC_CONF", "TORCH_FR_",
                  "TORCH_INCLUDE_", "TORCH_CPP_LOG_LEVEL", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE",
                  "PYTORCH_NVML_BASED_CUDA_CHECK")


class ForkServerGone(Exception):
    """The server is not there any more: start fresh interpreters."""


def differences(launcher: Mapping[str, str], worker: Mapping[str, str]) -> list[str]:
    """Variables read at start-up or import whose values differ (a forked worker would not see them)."""
    keys = {k for k in (*launcher, *worker) if k.startswith(_IMPORT_TIME) and not k.startswith(_NOT_AT_IMPORT)}
    return sorted(k for k in keys if launcher.get(k) != worker.get(k))


def forkable(argv: Sequence[str]) -> bool:
    """A worker command line that the server can stand for: ``python -u -m boot TARGET...``."""
    return len(argv) >= 5 and list(argv[1:4]) == ["-u", "-m", BOOT_MODULE] and \
        os.path.realpath(argv[0]) == os.path.realpath(sys.executable)


def _cpp_log_level_settable() -> bool:
    import ctypes

    torch = sys.modules.get("torch")
    try:
        lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so"))  # type: ignore[union-attr]
        ctypes.c_int.in_dll(lib, "FLAGS_caffe2_log_level")
    except (OSError, ValueError, AttributeError, TypeError):
        return False
    return True


def start_for(argv: Sequence[str], env: Mapping[str, str], preload: Sequence[str] = ()) -> "ForkServer | None":
    """Import torch and fork the server for workers ``argv``/``env``; None where a fork would not do."""
    if not forkable(argv):
        return None
    # The workers' OMP_NUM_THREADS is read at `import torch`: import it with the same, as torchrun's agent does.
    if "OMP_NUM_THREADS" in env and "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = env["OMP_NUM_THREADS"]
    if differences(os.environ, env):
        return None
    import torch  # noqa: F401  # the launcher needs it anyway (its rendezvous); the server shares it

    return ForkServer.start(preload, env)


class ServedProcess:
    """The part of ``subprocess.Popen`` the agent uses, for a worker the server forked."""

    def __init__(self, pid: int, server: "ForkServer", stdout: io.BufferedReader | None,
                 stderr: io.BufferedReader | None) -> None:
        self.pid = pid
        self.args = ["<forked>"]
        self.stdout = stdout
        self.stderr = stderr
        self.returncode: int | None = None
        self._server = server
        self._pidfd = os.pidfd_open(pid)

    def poll(self) -> int | None:
        if self.returncode is None and ready([self._pidfd], 0):
            self._collect()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not ready([self._pidfd], timeout):
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            self._collect()
        return self.returncode  # type: ignore[return-value]

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _collect(self) -> None:
        status = self._server.reap(self.pid)
        self.returncode = os.waitstatus_to_exitcode(status) if status is not None else -signal.SIGKILL
        try:
            os.close(self._pidfd)
        except OSError:
            pass


class ForkServer:
    """The agent's end: start (``start``), fork workers (``spawn``), reap them (``reap``), stop (``close``)."""

    def __init__(self, pid: int, sock: socket.socket) -> None:
        self.pid = pid
        self._sock = sock
        self._lock = threading.Lock()
        self.gone = False
        self.environ = dict(os.environ)  # what the server's torch import read

    @classmethod
    def start(cls, preload: Sequence[str] = (), env: Mapping[str, str] | None = None) -> "ForkServer | None":
        """Fork the server; None where that is not safe (threads, or a child cannot set torch's C++ log level)."""
        if "torch" not in sys.modules or not _cpp_log_level_settable():
            return None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        launcher = os.getpid()
        pid = fork_launcher()
        if pid is None:
            ours.close()
            theirs.close()
            return None
        if pid == 0:
            ours.close()
            _serve(theirs, launcher, preload, env)  # never returns
        theirs.close()
        return cls(pid, ours)

    def spawn(self, argv: Sequence[str], env: Mapping[str, str], *, cwd: str, stdout: Any, stderr: Any,
              pass_fds: Sequence[int] = ()) -> ServedProcess:
        """Fork a worker; ``stdout``/``stderr`` as Popen takes them (``subprocess.PIPE``, a file, None)."""
        made: list[int] = []
        ours: dict[str, io.BufferedReader | None] = {"stdout": None, "stderr": None}
        fds = [os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)]
        made.append(fds[0])
        try:
            for name, target, given in (("stdout", 1, stdout), ("stderr", 2, stderr)):
                if given == subprocess.PIPE:
                    read_end, write_end = os.pipe2(os.O_CLOEXEC)
                    ours[name] = io.open(read_end, "rb")  # as Popen's: buffered
                    made.append(write_end)
                    fds.append(write_end)
                elif given is None:
                    fds.append(target)
                else:
                    fds.append(given if isinstance(given, int) else given.fileno())
            fds.extend(pass_fds)
            message = {"op": "spawn", "argv": list(argv), "env": dict(env), "cwd": cwd,
                       "targets": [0, 1, 2, *pass_fds], "ignore": [int(s) for s in preemption_signals(env)]}
            pid = self._ask(message, fds).get("pid")
            if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
                raise ForkServerGone(f"the fork server answered no pid ({pid!r})")
        except BaseException:
            for stream in ours.values():
                if stream is not None:
                    stream.close()
            raise
        finally:
            for fd in made:
                os.close(fd)
        return ServedProcess(pid, self, ours["stdout"], ours["stderr"])

    def reap(self, pid: int) -> int | None:
        """The wait status of ``pid``, a worker that has ended; None where nobody can tell any more."""
        if not self.gone:
            try:
                return outside.integer(self._ask({"op": "wait", "pid": pid}).get("status"))
            except ForkServerGone:
                pass
        try:  # the server died: its children came to this process (a subreaper)
            got, status = os.waitpid(pid, 0)
            return status if got == pid else None
        except ChildProcessError:
            return None

    def close(self) -> None:
        """End the server (it exits when the socket closes) and reap it."""
        with self._lock:
            self.gone = True
            try:
                self._sock.close()
            except OSError:
                pass
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass

    def _ask(self, message: dict[str, Any], fds: Sequence[int] = ()) -> dict[str, Any]:
        with self._lock:
            if self.gone:
                raise ForkServerGone("the fork server has ended")
            try:
                _send(self._sock, message, fds)
                answer, extra = _receive(self._sock)
            except (OSError, ValueError) as err:
                self.gone = True
                raise ForkServerGone(f"the fork server stopped answering ({err})") from None
            for fd in extra:
                os.close(fd)
            if answer is None:
                self.gone = True
                raise ForkServerGone("the fork server has ended")
            return answer


def _send(sock: socket.socket, message: dict[str, Any], fds: Sequence[int] = ()) -> None:
    body = json.dumps(message).encode()
    data = _HEADER.pack(len(body)) + body
    sent = sock.sendmsg([data[:_HEADER.size]], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
                       if fds else [])
    sock.sendall(data[sent:])


def _receive(sock: socket.socket) -> tuple[dict[str, Any] | None, list[int]]:
    """One message and the descriptors that came with it; (None, []) at the end of the stream."""
    header, fds, _flags, _addr = socket.recv_fds(sock, _HEADER.size, MAX_FDS, socket.MSG_WAITALL)
    if len(header) < _HEADER.size:
        for fd in fds:
            os.close(fd)
        return None, []
    (size,) = _HEADER.unpack(header)
    if size > MAX_MESSAGE:
        raise ValueError(f"message of {size} bytes")
    body = b""
    while len(body) < size:
        chunk = sock.recv(size - len(body))
        if not chunk:
            raise ValueError("message cut short")
        body += chunk
    message = json.loads(body)
    if not isinstance(message, dict):
        raise ValueError("message is not an object")
    return message, list(fds)


def _serve(sock: socket.socket, launcher: int, preload: Sequence[str] = (),
           env: Mapping[str, str] | None = None) -> None:
    """The server's loop, in the forked child; never returns."""
    code = 0
    try:
        import ctypes

        os.setsid()  # a Ctrl-C at the terminal is the agent's to handle, not this process's
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != launcher:
            os._exit(1)
        # What a new process would inherit ignored (nohup's SIGHUP), before this process ignores more.
        inherited = [int(sig) for sig in signal.valid_signals()
                     if sig not in (signal.SIGKILL, signal.SIGSTOP) and signal.getsignal(sig) == signal.SIG_IGN]
        # Slurm signals every process of the step: the server outlives them; it ends with the launcher or its socket.
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGQUIT,
                    signal.SIGALRM):
            signal.signal(sig, signal.SIG_IGN)
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)  # a pipe the launcher's caller reads to its end must not be held open here
        # Nor the launcher's other descriptors (the monitor's end must read EOF when the launcher ends).
        close_from(3, keep={sock.fileno()})
        from mbr_launch.shim.proctitle import retitle, set_name

        if retitle(f"mbr-launch fork server of {launcher}", name=b"mbr-forkserver") is None:
            set_name(b"mbr-forkserver")  # no title: the name still tells it from the launcher
        if preload:
            _import_once(preload, env)
        me = os.getpid()
        while True:
            message, fds = _receive(sock)
            if message is None:
                break
            op = message.get("op")
            if op == "spawn":
                _answer_spawn(sock, message, fds, me, inherited)
            elif op == "wait":
                for fd in fds:
                    os.close(fd)
                _send(sock, {"status": _wait(message.get("pid"))})
            else:
                for fd in fds:
                    os.close(fd)
                _send(sock, {"error": "unknown op"})
    except BaseException:  # noqa: BLE001 - never return into the launcher's code
        code = 1
    os._exit(code)


def _answer_spawn(sock: socket.socket, message: dict[str, Any], fds: list[int], me: int,
                  inherited: list[int]) -> None:
    argv, env, cwd = message.get("argv"), message.get("env"), message.get("cwd")
    targets, ignore = message.get("targets"), message.get("ignore")
    valid = (isinstance(argv, list) and all(isinstance(a, str) for a in argv) and isinstance(env, dict)
             and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()) and isinstance(cwd, str)
             and isinstance(targets, list) and len(targets) == len(fds)
             and all(isinstance(t, int) and 0 <= t < 65536 for t in targets)
             and isinstance(ignore, list) and all(isinstance(s, int) for s in ignore))
    if not valid:
        for fd in fds:
            os.close(fd)
        _send(sock, {"error": "malformed spawn"})
        return
    pid = os.fork()
    if pid == 0:
        from mbr_launch.shim.forkchild import become

        become(argv=argv, env=env, cwd=cwd, fds=fds, targets=targets, ignore=ignore, server=me,  # type: ignore[arg-type]
               inherited=inherited)
    for fd in fds:
        os.close(fd)
    _send(sock, {"pid": pid})


def _wait(pid: object) -> int | None:
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return None
    try:
        got, status = os.waitpid(pid, 0)
    except ChildProcessError:
        return None
    return status if got == pid else None


def _import_once(modules: Sequence[str], env: Mapping[str, str] | None) -> None:
    """Import ``modules`` before any fork, recording what each read for the standbys' ``envwatch``; a failure is
    left to the standby to report, warnings hidden (they would reach the launcher's stderr)."""
    import importlib
    import warnings

    from mbr_launch.shim import envwatch

    if env is not None:
        envwatch.replace_environ(env)  # the children replace it with their own; the imports read a standby's
    for name in modules:
        reads: envwatch.Reads = {}
        written: dict[str, str | None] = {}
        try:
            with warnings.catch_warnings(), envwatch.recording(reads, written, name):
                warnings.simplefilter("ignore")
                importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the standby meets it and reports it
            continue
        envwatch.PRELOADED[name] = (reads, written)
    if threading.active_count() != 1:
        os._exit(1)  # an import left a thread running: forking is no longer safe; the agent starts interpreters
