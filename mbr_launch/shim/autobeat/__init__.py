"""Automatic step heartbeats for unmodified scripts: a heartbeat after every optimizer step, and marks of the
other signs that a script trains (checkpoints saved, collectives made).

``install()`` runs in every worker before the user's script (``mbr_launch.shim.boot`` calls it when the agent sets
``MBR_AUTOBEAT``). It must not import torch: scripts may set ``CUDA_VISIBLE_DEVICES`` or ``NCCL_*`` before
their own ``import torch``. So it only puts a finder on ``sys.meta_path`` that waits for
``torch.optim.optimizer`` (imported by ``import torch``). When that module has executed, the finder
registers our global hook with ``register_optimizer_step_post_hook``; it wraps the functions named below as
their modules are imported, and takes itself off ``sys.meta_path`` once it has nothing left to wait for.

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

Distributed checkpoints: ``torch.distributed.checkpoint``'s ``save``, ``save_state_dict`` and ``async_save``
are wrapped when that package is imported (never by us: it costs a second of imports), on the package and on
the module that defines them. Each sends the CHECKPOINT beat once its save has returned (``async_save``: once
its upload future has completed without an error); every rank saves its own shards, so every rank marks.
``torch.save`` calls made inside one of these (DCP writes some entries with it) mark nothing of their own.
NVRx's asynchronous and local checkpoints, and Megatron-Core's asynchronous ones, mark when they are
finalized (``torchhooks``).

Collectives: the Python-level c10d collectives (``torchhooks.COLLECTIVES``: all_reduce, all_gather, broadcast,
barrier ...) are wrapped when ``torch.distributed.distributed_c10d`` is imported, before ``torch.distributed``
re-exports them, with a process-wide counter. Once a process has made ``WORK_COLLECTIVES`` (20) of them it sends
one beat flagged ``WORK`` and counts no further: a script that trains without ``torch.optim`` (gradients
all-reduced by hand, an optimizer of its own) still shows the monitor that it is past start-up, so a
failure then is no crash loop. The wrapper costs one Python call and a compare per collective: 0.14 us (0.20 us
with keyword arguments) on an idle core (timeit, Python 3.12), against 15-30 us of host time for a one-element
all_reduce on one rank (NCCL on an H200, gloo); the counting itself, a few nanoseconds. DDP's gradient
all-reduces run in C++ and are not seen (DDP scripts step an optimizer anyway).
The wrappers stay for the process's life (torch.compile maps ``dist.*`` functions by identity to traceable
ones: ``torch.distributed._functional_collectives.traceable_collective_remaps`` holds our wrappers when it is
imported after them, and gets them added when it was imported before).

A warm standby may be assigned while its preload thread is still inside ``import torch``: ``install`` then
puts the finder on the path for what is imported from then on, and a short-lived thread hooks the modules
imported before, as soon as ``torch`` has finished executing (the script's own ``import torch`` waits for the
whole preload, so it finds them hooked).

End of training: the time after the last step (teardown, a final save) is no hang. A beat flagged
``FINISHED`` is sent when the script calls ``torch.distributed.destroy_process_group`` (wrapped when
``torch.distributed.distributed_c10d`` is imported, before ``torch.distributed`` re-exports it) and at
interpreter exit; the monitor then stops the rank's step clock until its next step.
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

# The modules whose functions torchhooks hooks (its AT_EXEC and IMPORTED tables, keyed by these names: a test
# checks that they agree), in the order ``import torch`` imports the first three.
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
    """A meta-path finder that hooks the loaders of ``torch.optim.optimizer``,
    ``torch.distributed.distributed_c10d``, ``torch.serialization`` and ``torch.distributed.checkpoint`` when
    they are imported (and ``torch.distributed._functional_collectives``, to keep torch.compile's collective
    remapping right), then takes itself off ``sys.meta_path``. The first three come with ``import torch``; the
    finder waits for the others as long as the script may import them (a set lookup per import)."""

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
    """The module that wraps torch's functions (``torchhooks``): imported only once torch is being imported, so
    that importing the shim loads nothing more (tests/test_shim_isolation.py)."""
    from mbr_launch.shim.autobeat import torchhooks

    return torchhooks


def _hook_safely(hook: Any, module: Any, beater: _Beater, locked: bool = False) -> None:
    """Run one hook; a hook that fails (a library changed the shape we wrap) costs that sign, never the
    user's import or script."""
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
        # A warm standby assigned in the middle of its preload: another thread is importing torch right now.
        # The finder hooks what is imported from now on; what was imported before (or while the finder went
        # on the path) is hooked as soon as that import is done, before the script's own ``import torch``
        # returns (it waits for the whole preload).
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
