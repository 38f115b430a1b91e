"""Automatic step heartbeats for unmodified scripts: a heartbeat after every optimizer step.

``install()`` runs in every worker before the user's script (``mbr_launch.shim.boot`` calls it when the agent sets
``MBR_AUTOBEAT``). It must not import torch: scripts may set ``CUDA_VISIBLE_DEVICES`` or ``NCCL_*`` before
their own ``import torch``. So it only puts a finder on ``sys.meta_path`` that waits for
``torch.optim.optimizer`` (imported by ``import torch``). When that module has executed, the finder
registers our global hook with ``register_optimizer_step_post_hook`` and takes itself off ``sys.meta_path``.

Each optimizer step then sends one 16-byte datagram (``BEAT``: step index, seconds since the previous step,
CPU seconds this thread spent in them, flags) to the rank monitor's per-rank datagram socket
``MBR_AUTOBEAT_SOCKET``. The send is non-blocking and errors are swallowed: a full queue or a gone monitor
drops the beat, it never stalls or breaks training. Measured cost: a few microseconds per step
(benchmarks/RESULTS.md).

The CPU seconds are what straggler scores use: in synchronous data-parallel training every rank's step
period is the same (fast ranks wait for the slow one in the gradient all-reduce), while the time a rank's
own thread spends computing is not. Threads blocked in a collective use no CPU; with CUDA, a host thread
that spins in a synchronize does, so on GPUs the scores see host-side slowness only.

Several optimizers: only the first optimizer that steps is counted (until it is garbage-collected), so a
GAN's two optimizers or a per-group optimizer list still give one beat per training step.

Checkpoints: ``torch.save`` is wrapped (when ``torch.serialization`` is imported; ``torch.save`` is the same
function) so that saving a dict (a state dict, or ``{"model": ..., "optimizer": ..., "step": ...}``) sends a
beat flagged ``CHECKPOINT`` once the save has returned. Goodput then counts only the steps after the last
checkpoint as lost when a failure comes, instead of the attempt's whole stepping time. Saves of anything
else (a tensor, a list of metrics) are not checkpoints. In a job where only rank 0 saves, nodes without
rank 0 never see a checkpoint and report their lost work pessimistically.

End of training: the time after the last step (teardown, a final save) is no hang. A beat flagged
``FINISHED`` is sent when the script calls ``torch.distributed.destroy_process_group`` (wrapped when
``torch.distributed.distributed_c10d`` is imported, before ``torch.distributed`` re-exports it) and at
interpreter exit; the monitor then stops the rank's step clock until its next step.
"""

from __future__ import annotations

import atexit
import functools
import os
import socket
import sys
import time
import weakref
from collections.abc import Mapping
from typing import Any, Optional

# The datagram layout and its flags are shared with the rank monitor (mbr_launch.monitor.steps).
from mbr_launch.contract import AUTOBEAT_SOCKET_ENV as SOCKET_ENV
from mbr_launch.contract import BEAT, CHECKPOINT, FINISHED, FIRST

TARGET = "torch.optim.optimizer"
C10D = "torch.distributed.distributed_c10d"
SERIALIZATION = "torch.serialization"

_state: Optional["_Beater"] = None


class _Beater:
    __slots__ = ("sock", "step", "last", "last_cpu", "owner", "handle")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.step = 0
        self.last = time.perf_counter()
        self.last_cpu = time.thread_time()
        self.owner: Any = None  # weakref to the optimizer whose steps count
        self.handle: Any = None  # torch's RemovableHandle

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

    def _mark(self, flags: int) -> None:
        try:
            self.sock.send(BEAT.pack(self.step & 0xFFFFFFFF, 0.0, 0.0, flags))
        except OSError:
            pass


class _Finder:
    """A meta-path finder that hooks the loaders of ``torch.optim.optimizer``,
    ``torch.distributed.distributed_c10d`` and ``torch.serialization`` when they are imported, then takes
    itself off ``sys.meta_path``."""

    def __init__(self, beater: _Beater) -> None:
        self.beater = beater
        self.waiting = set(_HOOKS)

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
                _HOOKS[name](module, beater)

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


def _register(module: Any, beater: _Beater) -> None:
    register = getattr(module, "register_optimizer_step_post_hook", None)
    if register is not None and beater.handle is None:
        beater.handle = register(beater)


def _wrap_destroy(module: Any, beater: _Beater) -> None:
    original = getattr(module, "destroy_process_group", None)
    if original is None or getattr(original, "__mbr_autobeat__", False):
        return

    @functools.wraps(original)
    def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
        beater.finished()
        return original(*args, **kwargs)

    destroy_process_group.__mbr_autobeat__ = True  # type: ignore[attr-defined]
    module.destroy_process_group = destroy_process_group


def _wrap_save(module: Any, beater: _Beater) -> None:
    original = getattr(module, "save", None)
    if original is None or getattr(original, "__mbr_autobeat__", False):
        return

    @functools.wraps(original)
    def save(obj: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(obj, *args, **kwargs)
        if isinstance(obj, Mapping):  # after the save returned: a save that raised is no checkpoint
            beater.checkpoint()
        return result

    save.__mbr_autobeat__ = True  # type: ignore[attr-defined]
    module.save = save


_HOOKS = {TARGET: _register, C10D: _wrap_destroy, SERIALIZATION: _wrap_save}


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
    if TARGET in sys.modules:  # torch was imported before us (a warm standby, a sitecustomize): hook it now
        _register(sys.modules[TARGET], beater)
        c10d = sys.modules.get(C10D)
        if c10d is not None:
            _wrap_destroy(c10d, beater)
            dist = sys.modules.get("torch.distributed")
            if dist is not None and hasattr(dist, "destroy_process_group"):
                dist.destroy_process_group = c10d.destroy_process_group
        serialization = sys.modules.get(SERIALIZATION)
        torch = sys.modules.get("torch")
        if serialization is not None:
            _wrap_save(serialization, beater)
            if torch is not None and hasattr(torch, "save"):
                torch.save = serialization.save
    else:
        sys.meta_path.insert(0, _Finder(beater))
    return True


def uninstall() -> None:
    """Remove the hook and the finder (tests; a script never needs this)."""
    global _state
    for finder in [f for f in sys.meta_path if isinstance(f, _Finder)]:
        finder.remove()
    if _state is not None:
        atexit.unregister(_state.finished)
        if _state.handle is not None:
            _state.handle.remove()
        _state.sock.close()
        _state = None


def installed() -> bool:
    return _state is not None and _state.handle is not None
