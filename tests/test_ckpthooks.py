"""autobeat's hooks of NVRx's asynchronous and local checkpoints (shim/autobeat/torchhooks.py), on stand-in classes
of the same shape: what marks a checkpoint and what does not. The real libraries under a launch:
tests/test_progress_signs.py."""

from __future__ import annotations

import types

import pytest

from mbr_launch.shim import autobeat
from mbr_launch.shim.autobeat import torchhooks


class Beater:
    def __init__(self) -> None:
        self.marks = 0

    def checkpoint(self) -> None:
        self.marks += 1


def queue_module(results: list) -> types.ModuleType:
    class AsyncCallsQueue:
        def maybe_finalize_async_calls(self, blocking=False, no_dist=False):
            result = results.pop(0)
            if isinstance(result, Exception):
                raise result
            return result

    return types.SimpleNamespace(AsyncCallsQueue=AsyncCallsQueue)  # type: ignore[return-value]


def test_a_finalized_asynchronous_call_marks_and_an_unfinished_one_does_not():
    beater, module = Beater(), queue_module([[], [1], [2, 3], OSError("writer died")])
    torchhooks.wrap_async_queue(module, beater)
    torchhooks.wrap_async_queue(module, beater)  # hooked once, however often the module is seen
    queue = module.AsyncCallsQueue()
    assert queue.maybe_finalize_async_calls() == [] and beater.marks == 0
    assert queue.maybe_finalize_async_calls(blocking=True) == [1] and beater.marks == 1
    assert queue.maybe_finalize_async_calls(True, True) == [2, 3] and beater.marks == 2
    with pytest.raises(OSError):
        queue.maybe_finalize_async_calls()
    assert beater.marks == 2


def test_a_synchronous_local_save_marks_and_an_asynchronous_one_waits_for_its_queue():
    request = object()

    class BaseCheckpointManager:
        def save(self, state_dict, iteration, is_async=False):
            return request if is_async else None

    beater, module = Beater(), types.SimpleNamespace(BaseCheckpointManager=BaseCheckpointManager)
    torchhooks.wrap_local_manager(module, beater)
    manager = BaseCheckpointManager()
    assert manager.save({}, 10) is None and beater.marks == 1
    assert manager.save({}, 20, is_async=True) is request and beater.marks == 1


def test_a_module_of_another_shape_is_left_alone():
    for hook in set(torchhooks.CHECKPOINT_HOOKS.values()):
        hook(types.SimpleNamespace(), Beater())  # no such class: nothing to wrap, nothing raised


def test_a_failing_hook_costs_its_sign_not_the_import():
    def broken(module, beater):
        raise AttributeError("a library changed shape")

    autobeat._hook_safely(broken, types.SimpleNamespace(), Beater())  # returns: the import goes on
    assert set(torchhooks.CHECKPOINT_HOOKS) == set(autobeat.CHECKPOINTERS)
