"""A join in progress: how far it has come, and its wake when its round completes.

How many nodes have joined: torch has no public call for this; we read its pickled state
(``torch_internals.decode_state``). Anything unexpected reads as "unknown": this is a progress line.

The wake: the agent that completes the round sets a key for it; a waiting join's one-second pause is a
``wait`` for that key on an idle pooled connection (never the handler's: that would hold up the keep-alive),
and a woken pause marks torch's state cache stale. Without a key or an idle connection, the pause is torch's.
"""

from __future__ import annotations

import contextlib
import datetime
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from mbr_launch.cluster import rdzvstore, storeclients, torch_internals
from mbr_launch.cluster.storevalue import Sealer
from mbr_launch.cluster.torch_internals import Patch


@dataclass(frozen=True)
class JoinState:
    joined: int  # nodes in the round being formed
    waiting: int  # nodes queued behind a round that is already complete (running)
    complete: bool  # a round is complete: this node waits to be admitted to the next one
    spares: int = 0  # nodes beyond --nnodes MAX, in torch's redundancy list
    members: tuple[tuple[str, int], ...] = ()  # the round's nodes: (address, group rank)
    outsiders: tuple[str, ...] = ()  # the addresses of the nodes waiting outside it (wait list, spares)

    @property
    def outside(self) -> int:
        return self.waiting + self.spares


def join_state(view: torch_internals.StateView) -> JoinState:
    return JoinState(joined=len(view.members), waiting=len(view.waiting), complete=view.complete,
                     spares=len(view.spares), members=view.members,
                     outsiders=tuple(sorted((*view.waiting, *view.spares))))


class JoinCounter:
    """Reads the join state of a c10d rendezvous; ``read()`` is None while unknown. One thread only.

    ``shared``: read on the handler's own client (safe: torch's client serialises operations), sparing the
    main thread a new connection and torch's connect back-off on the restart's path.
    """

    def __init__(self, handler: Callable[[], Any], sealer: Sealer, *, timeout: float = 2.0,
                 shared: bool = False) -> None:
        self._get_handler = handler  # torch's DynamicRendezvousHandler once made (None before; another: unknown)
        self._sealer = sealer  # the job's: torch's state is verified before it is unpickled
        self._timeout = timeout
        self._shared = shared
        self._backend: Any = None

    def _connect(self) -> Any:
        handler = self._get_handler()
        own = torch_internals.handler_store(handler)  # the c10d backend's TCPStore (host and port)
        host, port = getattr(own, "host", None), getattr(own, "port", None)
        if not (host and port):
            return None
        run_id = handler.get_run_id()
        if self._shared:
            return rdzvstore.backend(own, run_id, self._sealer)
        # the agent's pool, where the first round's connections were opened while it waited to join
        return rdzvstore.backend(storeclients.POOL.acquire(host, int(port), self._timeout), run_id, self._sealer)

    def read(self) -> JoinState | None:
        try:
            if self._backend is None:
                self._backend = self._connect()
                if self._backend is None:
                    return None
            got = self._backend.get_state()
            if got is None:  # nobody has written a state yet
                return JoinState(joined=0, waiting=0, complete=False)
            return join_state(torch_internals.decode_state(got[0]))
        except Exception:  # a progress line is never worth an error
            return None


# ---- the wake ----------------------------------------------------------------------------------------------

PAUSE = 1.0  # torch's pause between two reads of the state while it waits in a join
# A wait inside torch's C++ client holds off this thread's signal handlers until it returns: short waits keep a
# Ctrl-C prompt (a whole second let the stuck-signal watchdog end the agent too).
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


def install_wake(handler: Any, *, host: str, port: int, prefix: str) -> tuple[Patch, JoinWake | None]:
    """Wake ``handler``'s joins at their round's completion; no wake (None) where the patch did not take."""
    global _torch_delay
    patch = torch_internals.JOIN_WAKE.check(handler)
    if not patch.installed:
        return patch, None
    holder = torch_internals.state_holder(handler)
    torchs = torch_internals.swap_join_pause(_delay)
    if torchs is not None:  # None: ours already (an earlier handler of this process)
        _torch_delay = torchs
    return patch, JoinWake(holder, torch_internals.holder_store(holder), host, port, prefix)
