"""torch's own rendezvous state, sealed with the job's secret before torch unpickles it.

torch keeps the state as a pickle every agent loads: whoever writes the key runs code on every agent. A forged
state is not an error (one write would stop the job): torch gets the last authentic state with the forgery's
token, so its next compare-and-set replaces the forgery. Without a secret everything passes through.
"""

from __future__ import annotations

from typing import Any

from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousBackend

from mbr_launch.cluster import storevalue, torch_internals
from mbr_launch.cluster.storevalue import Sealer


class SealedBackend(RendezvousBackend):
    """torch's ``C10dRendezvousBackend`` with every state sealed on the way in and verified on the way out."""

    def __init__(self, inner: Any, run_id: str, sealer: Sealer) -> None:
        self._inner = inner
        self._sealer = sealer  # the job's
        self._key = f"torch.rendezvous.{run_id}"  # the key torch's backend keeps its state under
        self._last: bytes | None = None  # the last authentic state read or written
        self.refused = 0  # forged states seen (for tests and the record)

    @property
    def name(self) -> str:
        return str(self._inner.name)

    def get_state(self) -> tuple[bytes, Any] | None:
        got = self._inner.get_state()
        if got is None:
            return None
        state, token = got
        return self._open(state), token

    def set_state(self, state: bytes, token: Any | None = None) -> tuple[bytes, Any, bool] | None:
        got = self._inner.set_state(self._sealer.seal(self._key, state), token)
        if got is None:
            return None
        stored, new_token, written = got
        return self._open(stored), new_token, written

    def _open(self, blob: bytes) -> bytes:
        try:
            self._last = self._sealer.open(self._key, blob)
            return self._last
        except storevalue.RefusedValue:
            self.refused += 1
            return self._last if self._last is not None else torch_internals.empty_state()


def backend(store: Any, run_id: str, sealer: Sealer) -> RendezvousBackend:
    """torch's c10d backend over ``store``, sealed when the job has a secret."""
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

    inner = C10dRendezvousBackend(store, run_id)
    return SealedBackend(inner, run_id, sealer) if sealer.enabled else inner

