"""A join that learns of its round's completion at once, not at its next poll.

While an agent waits in torch's c10d join it re-reads the rendezvous state once a second (``_delay(seconds=1)``).
The last agent to arrive completes the round; every other agent notices at its next read, and every agent but
group rank 0 then waits for rank 0's master address, which rank 0 writes only once it has noticed too: a round
formed up to a second after its last member arrived.

Here the agent whose write of the completed state went through also sets a key for that round, and a waiting
join's one-second pause is a ``wait`` for that key, on an idle connection of the agent's pool (never on the
handler's own client: a blocking wait there would hold up torch's keep-alive). A woken pause also marks torch's
state cache stale (it serves a read within a second of the last from it), and a round's key ends at most one
pause. Where no key comes (an older mbr-launch, a torch without these internals) or no idle connection is
there, the pause is torch's own second.
"""

from __future__ import annotations

import contextlib
import datetime
import threading
import time
from typing import Any, Callable, Iterator

from mbr_launch.cluster import storeclients, torch_internals
from mbr_launch.cluster.torch_internals import Patch

PAUSE = 1.0  # torch's pause between two reads of the state while it waits in a join
# A wait inside torch's C++ client holds off this thread's signal handlers until it returns: waits of at most
# STEP keep a Ctrl-C in the join prompt (a whole second let the stuck-signal watchdog, agent/wakeup.py, end the
# agent too, and the signal and the end were recorded twice).
STEP = 0.25
_local = threading.local()
_torch_delay: Callable[..., None] | None = None


class JoinWake:
    def __init__(self, holder: Any, store: Any, host: str, port: int, prefix: str) -> None:
        self._holder, self._store, self._host, self._port = holder, store, host, port
        self._prefix = prefix  # + the round: the key its completer sets
        self._announced: int | None = None
        self._woken_round: int | None = None  # a round's key ends one pause only: it never goes away
        self.woken = False  # the last join's pause ended because its round was complete
        self._sync = holder.sync
        holder.sync = self._synced  # an instance attribute: torch's executor calls holder.sync()

    def _synced(self) -> Any:
        has_set = self._sync()
        state = self._holder.state
        if has_set and state.complete and state.round != self._announced:
            try:
                self._store.set(self._prefix + str(state.round), b"1")
                self._announced = state.round
            except Exception:
                pass  # the others read the state at their next poll, as without this
        return has_set

    def pause(self, seconds: float) -> None:
        """torch's pause between two reads of the state, ended early when the round completes."""
        state = self._holder.state
        client = None
        if not state.complete and state.round != self._woken_round:
            client = storeclients.POOL.take_idle(self._host, self._port)
        if client is None:  # complete already (a waiting spare), or woken once: the key would not wait
            _torch_delay(seconds)  # type: ignore[misc]
            return
        key, deadline = self._prefix + str(state.round), time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                client.wait([key], datetime.timedelta(seconds=min(STEP, left)))
            except Exception as err:
                if "timeout" not in str(err).lower():
                    return  # a broken connection is not given back; the next pause reads the state again
                continue
            self.woken, self._woken_round = True, state.round
            torch_internals.mark_state_stale(self._holder)  # torch's next sync reads the store, not its cache
            break
        storeclients.POOL.release(client)

    @contextlib.contextmanager
    def waiting(self) -> Iterator["JoinWake"]:
        """Around ``next_rendezvous`` on this thread: its pauses end when the round completes."""
        self.woken = False
        _local.wake = self
        try:
            yield self
        finally:
            _local.wake = None


def _delay(seconds: float | tuple[float, float]) -> None:
    wake: JoinWake | None = getattr(_local, "wake", None)
    if wake is not None and seconds == PAUSE:
        wake.pause(PAUSE)
    else:
        _torch_delay(seconds)  # type: ignore[misc]


def install(handler: Any, *, host: str, port: int, prefix: str) -> tuple[Patch, JoinWake | None]:
    """Wake ``handler``'s joins at their round's completion. The record says whether it took; where torch's
    internals are not as expected there is no wake (None) and the joins poll as torch's do."""
    global _torch_delay
    patch = torch_internals.JOIN_WAKE.check(handler)
    if not patch.installed:
        return patch, None
    holder = torch_internals.state_holder(handler)
    torchs = torch_internals.swap_join_pause(_delay)
    if torchs is not None:  # None: ours already (an earlier handler of this process)
        _torch_delay = torchs
    return patch, JoinWake(holder, torch_internals.holder_store(holder), host, port, prefix)
