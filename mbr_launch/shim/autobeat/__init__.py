"""Automatic step heartbeats for unmodified scripts: a heartbeat after every optimizer step, and marks of the
other signs that a script trains (checkpoints saved, collectives made).

``install()`` runs before the user's script (``shim.boot``, when ``MBR_AUTOBEAT`` is set) and must not import
torch (scripts set ``CUDA_VISIBLE_DEVICES`` or ``NCCL_*`` before their own import): it puts a finder on
``sys.meta_path`` that hooks the ``HOOKED`` modules as they are imported (``torchhooks`` says what each hook
does) and leaves the path once nothing is awaited. A warm standby assigned mid-preload also hooks, from a
short-lived thread, what its ``import torch`` under way has imported.

Each step of the first optimizer that steps sends a ``BEAT`` datagram (index, period, this thread's CPU
seconds: what tells stragglers apart, as synchronous ranks share one period) to ``MBR_AUTOBEAT_SOCKET``,
non-blocking: a full queue drops it, never stalls training. Marks: ``CHECKPOINT`` after a save, ``WORK`` after
``torchhooks.WORK_COLLECTIVES`` collectives (training without ``torch.optim``), ``FINISHED`` at
``destroy_process_group`` and exit (the time after the last step is no hang).
"""

from __future__ import annotations

import atexit
import os
import socket
import sys
import threading
import time
import weakref
from typing import Any, Optional

# The datagram layout and its flags are shared with the rank monitor (mbr_launch.monitor.steps).
from mbr_launch.contract import AUTOBEAT_SOCKET_ENV as SOCKET_ENV
from mbr_launch.contract import BEAT, CHECKPOINT, FINISHED, FIRST, WORK

TARGET = "torch.optim.optimizer"
C10D = "torch.distributed.distributed_c10d"
SERIALIZATION = "torch.serialization"
DCP = "torch.distributed.checkpoint"
FUNCTIONAL = "torch.distributed._functional_collectives"
# NVRx's and Megatron-Core's checkpoint modules (torchhooks: their asynchronous and local checkpoints)
CHECKPOINTERS = ("nvidia_resiliency_ext.checkpointing.async_ckpt.core",
                 "megatron.core.dist_checkpointing.strategies.async_utils",
                 "nvidia_resiliency_ext.checkpointing.local.ckpt_managers.base_manager")

# The modules torchhooks hooks (the keys of its AT_EXEC and IMPORTED tables: a test checks that they agree).
HOOKED = (SERIALIZATION, C10D, TARGET, DCP, FUNCTIONAL, *CHECKPOINTERS)

_state: Optional["_Beater"] = None


class _Beater:
    __slots__ = ("sock", "step", "last", "last_cpu", "owner", "handle", "worked", "saving")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.step = 0
        self.last = time.perf_counter()
        self.last_cpu = time.thread_time()
        self.owner: Any = None  # weakref to the optimizer whose steps count
        self.handle: Any = None  # torch's RemovableHandle
        self.worked = False  # the WORK beat was sent
        self.saving = threading.local()  # .depth: inside a torch.distributed.checkpoint save, on this thread

    def __call__(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        owner = self.owner
        if owner is None or owner() is None:
            try:
                self.owner = weakref.ref(optimizer)
            except TypeError:
                return
        elif owner() is not optimizer:
            return
        now, cpu = time.perf_counter(), time.thread_time()
        self.step += 1
        try:
            self.sock.send(BEAT.pack(self.step & 0xFFFFFFFF, now - self.last, cpu - self.last_cpu,
                                     FIRST if self.step == 1 else 0))
        except OSError:
            pass  # queue full (monitor busy) or monitor gone: drop the beat, never block training
        self.last, self.last_cpu = now, cpu

    def finished(self) -> None:
        self._mark(FINISHED)

    def checkpoint(self) -> None:
        self._mark(CHECKPOINT)

    def work(self) -> None:
        if not self.worked:
            self.worked = True
            self._mark(WORK)

    def in_dcp_save(self) -> bool:
        return getattr(self.saving, "depth", 0) > 0

    def _mark(self, flags: int) -> None:
        try:
            self.sock.send(BEAT.pack(self.step & 0xFFFFFFFF, 0.0, 0.0, flags))
        except OSError:
            pass


class _Finder:
    """A meta-path finder that hooks the loaders of the ``HOOKED`` modules as they are imported, then takes
    itself off ``sys.meta_path`` (a set lookup per import until then)."""

    def __init__(self, beater: _Beater) -> None:
        self.beater = beater
        self.waiting = set(HOOKED)

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in self.waiting:
            return None
        self.waiting.discard(name)
        self.remove()  # look past ourselves; back on the path below while a module is still awaited
        try:
            spec = None
            for finder in sys.meta_path:
                find = getattr(finder, "find_spec", None)
                spec = find(name, path, target) if find else None
                if spec is not None:
                    break
            exec_module = getattr(spec.loader, "exec_module", None) if spec is not None else None
            if exec_module is None:
                return spec
            beater = self.beater

            def exec_and_hook(module: Any) -> None:
                exec_module(module)
                _hook_safely(_hooks().AT_EXEC.get(name), module, beater)

            # The loader is a fresh object per find_spec: patching it touches nobody else's import.
            spec.loader.exec_module = exec_and_hook
            return spec
        finally:
            if self.waiting:
                sys.meta_path.insert(0, self)

    def remove(self) -> None:
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass


_hooking = threading.Lock()  # the finder (in whichever thread imports) and _hook_when_imported's thread


def _hooks() -> Any:
    """``torchhooks``, imported only once torch is being imported (tests/test_shim_isolation.py)."""
    from mbr_launch.shim.autobeat import torchhooks

    return torchhooks


def _hook_safely(hook: Any, module: Any, beater: _Beater, locked: bool = False) -> None:
    """Run one hook; one that fails costs that sign, never the user's import or script."""
    if hook is None:
        return
    try:
        if locked:
            hook(module, beater)
        else:
            with _hooking:
                hook(module, beater)
    except Exception:
        pass


def _initializing(module: Any) -> bool:
    """The module is in sys.modules but its body is still executing (in another thread)."""
    return bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


def _hook_imported(beater: _Beater, finder: _Finder) -> None:
    """Hook every module imported so far; the finder waits for the others."""
    hooks = _hooks().IMPORTED if any(name in sys.modules for name in finder.waiting) else {}
    with _hooking:
        for name, hook in hooks.items():
            module = sys.modules.get(name)
            if module is not None and name in finder.waiting and not _initializing(module):
                finder.waiting.discard(name)
                _hook_safely(hook, module, beater, locked=True)
        if not finder.waiting:
            finder.remove()


def _hook_when_imported(beater: _Beater, finder: _Finder, limit: float = 600.0) -> None:
    """A thread: wait for the ``import torch`` under way in another thread, then hook what it imported."""
    deadline = time.monotonic() + limit
    while _initializing(sys.modules.get("torch")) and time.monotonic() < deadline:
        time.sleep(0.005)
    _hook_imported(beater, finder)


def install(path: Optional[str] = None) -> bool:
    """Arrange for step heartbeats to ``path`` (default ``$MBR_AUTOBEAT_SOCKET``). True when armed."""
    global _state
    path = path or os.environ.get(SOCKET_ENV)
    if not path or _state is not None:
        return False
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        return False
    _state = beater = _Beater(sock)
    atexit.register(beater.finished)
    finder = _Finder(beater)
    if _initializing(sys.modules.get("torch")):
        # A warm standby assigned mid-preload: another thread is importing torch. What it imported is hooked
        # once it is done, before the script's own ``import torch`` returns (that waits for the preload).
        sys.meta_path.insert(0, finder)
        threading.Thread(target=_hook_when_imported, args=(beater, finder), name="mbr-autobeat-hook",
                         daemon=True).start()
        return True
    _hook_imported(beater, finder)  # torch imported before us (a warm standby, a sitecustomize): hook it now
    if finder.waiting:
        sys.meta_path.insert(0, finder)
    return True


def installed() -> bool:
    return _state is not None and _state.handle is not None
