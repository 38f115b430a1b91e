"""How far a rendezvous that this node waits in has come: how many nodes have joined so far.

torch has no public call for this; we read its pickled state (``torch_internals.decode_state``). Anything
unexpected reads as "unknown", never as an error: this is a progress line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from mbr_launch.cluster import sealedstate, storeclients, torch_internals
from mbr_launch.cluster.storevalue import Sealer


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
            return sealedstate.backend(own, run_id, self._sealer)
        # the agent's pool, where the first round's connections were opened while it waited to join
        return sealedstate.backend(storeclients.POOL.acquire(host, int(port), self._timeout), run_id, self._sealer)

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
