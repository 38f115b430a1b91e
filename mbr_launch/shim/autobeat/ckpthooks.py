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
from typing import Any, Callable

NVRX_ASYNC = "nvidia_resiliency_ext.checkpointing.async_ckpt.core"
MCORE_ASYNC = "megatron.core.dist_checkpointing.strategies.async_utils"
NVRX_LOCAL = "nvidia_resiliency_ext.checkpointing.local.ckpt_managers.base_manager"

_Beater = Any  # the package's _Beater


def _mark_after(owner: Any, name: str, beater: _Beater, done: Callable[[Any], bool]) -> None:
    """Wrap ``owner.name`` (a method) so that a call whose result ``done`` accepts marks a checkpoint; a call
    that raises (a failed save) marks nothing. Wrapped once, however often its module is seen."""
    original = getattr(owner, name, None)
    if original is None or getattr(original, "__mbr_autobeat__", False):
        return

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        if done(result):
            beater.checkpoint()
        return result

    wrapper.__mbr_autobeat__ = True  # type: ignore[attr-defined]
    setattr(owner, name, wrapper)


def wrap_async_queue(module: Any, beater: _Beater) -> None:
    # the indices of the calls it finalized now: an empty list finalized nothing
    _mark_after(getattr(module, "AsyncCallsQueue", None), "maybe_finalize_async_calls", beater, bool)


def wrap_local_manager(module: Any, beater: _Beater) -> None:
    # None: a synchronous save is done; an AsyncRequest is marked when the queue finalizes it
    _mark_after(getattr(module, "BaseCheckpointManager", None), "save", beater, lambda request: request is None)


# By module name, for torchhooks' AT_EXEC and IMPORTED tables (executing or imported before us: the same).
HOOKS = {NVRX_ASYNC: wrap_async_queue, MCORE_ASYNC: wrap_async_queue, NVRX_LOCAL: wrap_local_manager}
