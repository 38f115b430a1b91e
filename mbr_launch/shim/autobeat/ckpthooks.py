"""Checkpoints that ``torch.save``'s own hook cannot see: NVRx's asynchronous and local checkpoints, and
Megatron-Core's asynchronous ones (the same queue, vendored there).

- Asynchronous (``AsyncCallsQueue``, NVRx's ``checkpointing.async_ckpt.core`` and Megatron-Core's
  ``dist_checkpointing.strategies.async_utils``): the save runs in a forked or spawned process, which may not
  carry our hooks at all, and the checkpoint counts only once the trainer has *finalized* it (its finalize
  functions validated and published it). So the mark goes with ``maybe_finalize_async_calls`` returning a call
  it finalized; ``close()`` finalizes through the same method.
- Local (``BaseCheckpointManager.save``, NVRx's ``checkpointing.local``): it hands ``torch.save`` a
  ``TensorAwareStateDict``, not a mapping, so the torch.save hook stays quiet; a synchronous save marks when it
  returns (written, renamed, validated by its finalize function); an asynchronous one returns an
  ``AsyncRequest`` whose finalization the queue's hook marks.

Like ``torchhooks`` this module imports nothing: it is handed each module as it finishes executing.
"""

from __future__ import annotations

import functools
from typing import Any

NVRX_ASYNC = "nvidia_resiliency_ext.checkpointing.async_ckpt.core"
MCORE_ASYNC = "megatron.core.dist_checkpointing.strategies.async_utils"
NVRX_LOCAL = "nvidia_resiliency_ext.checkpointing.local.ckpt_managers.base_manager"

_Beater = Any  # the package's _Beater


def _marked(function: Any) -> bool:
    return bool(getattr(function, "__mbr_autobeat__", False))


def wrap_async_queue(module: Any, beater: _Beater) -> None:
    queue = getattr(module, "AsyncCallsQueue", None)
    original = getattr(queue, "maybe_finalize_async_calls", None)
    if original is None or _marked(original):
        return

    @functools.wraps(original)
    def maybe_finalize_async_calls(self: Any, *args: Any, **kwargs: Any) -> Any:
        finalized = original(self, *args, **kwargs)
        if finalized:  # the indices of the calls finalized now; a raise (a failed save) is no checkpoint
            beater.checkpoint()
        return finalized

    maybe_finalize_async_calls.__mbr_autobeat__ = True  # type: ignore[attr-defined]
    queue.maybe_finalize_async_calls = maybe_finalize_async_calls


def wrap_local_manager(module: Any, beater: _Beater) -> None:
    manager = getattr(module, "BaseCheckpointManager", None)
    original = getattr(manager, "save", None)
    if original is None or _marked(original):
        return

    @functools.wraps(original)
    def save(self: Any, *args: Any, **kwargs: Any) -> Any:
        request = original(self, *args, **kwargs)
        if request is None:  # synchronous: done; an AsyncRequest is marked when the queue finalizes it
            beater.checkpoint()
        return request

    save.__mbr_autobeat__ = True  # type: ignore[attr-defined]
    manager.save = save


# By module name, for torchhooks' AT_EXEC and IMPORTED tables (executing or imported before us: the same).
HOOKS = {NVRX_ASYNC: wrap_async_queue, MCORE_ASYNC: wrap_async_queue, NVRX_LOCAL: wrap_local_manager}
