"""What autobeat does to torch's functions: the optimizer-step hook, and the wrappers of destroy_process_group,
the c10d collectives, torch.save and torch.distributed.checkpoint's saves; and of the checkpoints that
``torch.save``'s own hook cannot see: NVRx's asynchronous and local checkpoints, and Megatron-Core's asynchronous
ones (the same queue, vendored there).

A checkpoint counts once it is done: a ``torch.save`` of a mapping once it returns (not inside a DCP save),
``async_save`` when its upload future completes, an asynchronous queue's call once the trainer *finalized* it
(``maybe_finalize_async_calls``), a local save when it returns ``None`` (its async requests go through the
queue). ``AT_EXEC``: the hooks for a module that has just executed (its names re-exported only after);
``IMPORTED``: for one imported before us, rebinding its re-exports too. Imports nothing of the package.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Mapping
from typing import Any, Callable

# The modules hooked, by name, as the package's ``HOOKED`` (this module does not import the package).
TARGET = "torch.optim.optimizer"
C10D = "torch.distributed.distributed_c10d"
SERIALIZATION = "torch.serialization"
DCP = "torch.distributed.checkpoint"
FUNCTIONAL = "torch.distributed._functional_collectives"
NVRX_ASYNC = "nvidia_resiliency_ext.checkpointing.async_ckpt.core"
MCORE_ASYNC = "megatron.core.dist_checkpointing.strategies.async_utils"
NVRX_LOCAL = "nvidia_resiliency_ext.checkpointing.local.ckpt_managers.base_manager"

# The collectives counted towards the WORK mark, by their names in distributed_c10d (and torch.distributed).
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
               "broadcast", "reduce", "all_to_all", "all_to_all_single", "barrier")
# How many collectives make a process "working": start-up makes a few (a barrier, a DCP load, object
# collectives of a config) that must not count as training, well below this; training makes one a step or more.
WORK_COLLECTIVES = 20
# torch.distributed.checkpoint's saves; the asynchronous one returns before its checkpoint is written.
DCP_SAVES = ("save", "save_state_dict")
DCP_ASYNC_SAVES = ("async_save",)

collectives = 0  # collectives made by this process, counted up to WORK_COLLECTIVES
# Every ``beater`` below is the package's ``_Beater`` (untyped here: this module does not import the package).
_Beater = Any


def _wrap(owner: Any, name: str, make: Callable[[Any], Callable[..., Any]]) -> Any:
    """Replace ``owner.name`` by ``make(original)``, marked as ours; wrapped once, however often its module is
    seen. The wrapper, or None where there is nothing (left) to wrap."""
    original = getattr(owner, name, None)
    if original is None or not callable(original) or getattr(original, "__mbr_autobeat__", False):
        return None
    wrapper = functools.wraps(original)(make(original))
    wrapper.__mbr_autobeat__ = True  # type: ignore[attr-defined]
    setattr(owner, name, wrapper)
    return wrapper


def register(module: Any, beater: _Beater) -> None:
    """torch.optim.optimizer: a beat after every optimizer step (the beater is the global post-step hook)."""
    add = getattr(module, "register_optimizer_step_post_hook", None)
    if add is not None and beater.handle is None:
        beater.handle = add(beater)


def _hook_c10d(module: Any, beater: _Beater) -> None:
    _wrap_destroy(module, beater)
    _wrap_collectives(module, beater)


def _wrap_destroy(module: Any, beater: _Beater) -> None:
    def make(original: Any) -> Any:
        def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
            beater.finished()
            return original(*args, **kwargs)
        return destroy_process_group

    _wrap(module, "destroy_process_group", make)


def _count_collectives(original: Any, beater: _Beater) -> Any:
    """``original`` with the collective counter in front: a compare, and an add for the first calls only."""
    def collective(*args: Any, **kwargs: Any) -> Any:
        global collectives
        if collectives < WORK_COLLECTIVES:
            collectives += 1
            if collectives >= WORK_COLLECTIVES:  # ">=": two threads may both have added
                beater.work()
        return original(*args, **kwargs)

    return collective


def _wrap_collectives(module: Any, beater: _Beater) -> None:
    """Wrap ``COLLECTIVES`` in ``module`` (distributed_c10d)."""
    for name in COLLECTIVES:
        _wrap(module, name, lambda original: _count_collectives(original, beater))


def _wrap_save(module: Any, beater: _Beater) -> None:
    def make(original: Any) -> Any:
        def save(obj: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(obj, *args, **kwargs)
            # after the save returned: a save that raised is no checkpoint; one made by a DCP save is a part of it
            if isinstance(obj, Mapping) and not beater.in_dcp_save():
                beater.checkpoint()
            return result
        return save

    _wrap(module, "save", make)


def _dcp_saver(original: Any, beater: _Beater, asynchronous: bool) -> Any:
    def save(*args: Any, **kwargs: Any) -> Any:
        local = beater.saving
        local.depth = getattr(local, "depth", 0) + 1
        try:
            result = original(*args, **kwargs)
        finally:
            local.depth -= 1
        if asynchronous:
            _mark_when_done(result, beater)
        else:
            beater.checkpoint()
        return result

    return save


def _mark_when_done(result: Any, beater: _Beater) -> None:
    """``async_save``'s checkpoint is there when its upload future completes: a Future, or (torch 2.9+) an
    ``AsyncSaveResponse`` whose ``upload_completion`` is. Without a future to watch, nothing is marked."""
    future = getattr(result, "upload_completion", result)
    add = getattr(future, "add_done_callback", None)
    if add is None:
        return

    def done(f: Any) -> None:
        try:
            (getattr(f, "result", None) or f.value)()  # done: returns at once, or raises the save's error
        except BaseException:
            return
        beater.checkpoint()

    try:
        add(done)
    except Exception:
        pass


def _wrap_dcp(package: Any, beater: _Beater) -> None:
    """Wrap DCP's saves on the package and on the module that defines them (DCP's own asynchronous executor
    imports ``save`` from there)."""
    for names, asynchronous in ((DCP_SAVES, False), (DCP_ASYNC_SAVES, True)):
        for name in names:
            wrapper = _wrap(package, name, lambda original: _dcp_saver(original, beater, asynchronous))
            original = getattr(wrapper, "__wrapped__", None)
            home = sys.modules.get(getattr(original, "__module__", None) or "")
            if home is not None and home is not package and getattr(home, name, None) is original:
                setattr(home, name, wrapper)


def _fix_remaps(functional: Any, beater: _Beater) -> None:
    """torch.compile maps ``dist.*`` collectives to traceable ones by identity: give our wrappers the entries
    of the functions they wrap (a module imported after them holds the wrappers already)."""
    remaps = getattr(functional, "traceable_collective_remaps", None)
    c10d = sys.modules.get(C10D)
    if not isinstance(remaps, dict) or c10d is None:
        return
    for name in COLLECTIVES:
        wrapper = getattr(c10d, name, None)
        original = getattr(wrapper, "__wrapped__", None)
        if getattr(wrapper, "__mbr_autobeat__", False) and original in remaps and wrapper not in remaps:
            remaps[wrapper] = remaps[original]


def _mark_after(owner: Any, name: str, beater: _Beater, done: Callable[[Any], bool]) -> None:
    """Wrap ``owner.name`` (a method) so that a call whose result ``done`` accepts marks a checkpoint; a call
    that raises (a failed save) marks nothing."""
    def make(original: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            if done(result):
                beater.checkpoint()
            return result
        return wrapper

    _wrap(owner, name, make)


def wrap_async_queue(module: Any, beater: _Beater) -> None:
    # the indices of the calls it finalized now: an empty list finalized nothing
    _mark_after(getattr(module, "AsyncCallsQueue", None), "maybe_finalize_async_calls", beater, bool)


def wrap_local_manager(module: Any, beater: _Beater) -> None:
    # None: a synchronous save is done; an AsyncRequest is marked when the queue finalizes it
    _mark_after(getattr(module, "BaseCheckpointManager", None), "save", beater, lambda request: request is None)


# The checkpoint managers' hooks, the same whether their module executes now or was imported before us.
CHECKPOINT_HOOKS = {NVRX_ASYNC: wrap_async_queue, MCORE_ASYNC: wrap_async_queue, NVRX_LOCAL: wrap_local_manager}

# What the finder does once a module has executed, before torch and torch.distributed re-export its names.
AT_EXEC = {TARGET: register, C10D: _hook_c10d, SERIALIZATION: _wrap_save, DCP: _wrap_dcp, FUNCTIONAL: _fix_remaps,
           **CHECKPOINT_HOOKS}


def _reexport(module: Any, owner_name: str, names: tuple[str, ...], before: dict[str, Any]) -> None:
    """The module ``owner_name`` re-exported ``module``'s functions before we wrapped them: bind the wrappers
    there too (``before``: name -> the function before wrapping)."""
    owner = sys.modules.get(owner_name)
    for name in names:
        new = getattr(module, name, None)
        if owner is not None and new is not before.get(name) and getattr(owner, name, None) is before.get(name):
            setattr(owner, name, new)


def _hook_imported_c10d(c10d: Any, beater: _Beater) -> None:
    names = (*COLLECTIVES, "destroy_process_group")
    before = {name: getattr(c10d, name, None) for name in names}
    _hook_c10d(c10d, beater)
    _reexport(c10d, "torch.distributed", names, before)
    functional = sys.modules.get(FUNCTIONAL)
    if functional is not None:
        _fix_remaps(functional, beater)


def _hook_imported_serialization(serialization: Any, beater: _Beater) -> None:
    before = {"save": getattr(serialization, "save", None)}
    _wrap_save(serialization, beater)
    _reexport(serialization, "torch", ("save",), before)


# The same for a module that was imported before us, its re-exports included.
IMPORTED = {TARGET: register, C10D: _hook_imported_c10d, SERIALIZATION: _hook_imported_serialization,
            DCP: _wrap_dcp, FUNCTIONAL: _fix_remaps, **CHECKPOINT_HOOKS}
