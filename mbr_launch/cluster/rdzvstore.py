"""torch's c10d rendezvous handler over a TCPStore whose listening socket is ours (``cluster.listen``).

The same hosting rules as torch's registry (the first agent on the endpoint's machine hosts, the others
connect), and torch's own handler and backend. A file store, or a torch without ``master_listen_fd``, goes
through torch's registry unchanged.

torch's state is sealed with the job's secret before torch unpickles it (``SealedBackend``): whoever writes the
key would otherwise run code on every agent. A forged state is not an error (one write would stop the job):
torch gets the last authentic state with the forgery's token, so its next compare-and-set replaces it.
"""

from __future__ import annotations

import datetime
from typing import Any

from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous import RendezvousConnectionError, RendezvousParameters
from torch.distributed.elastic.rendezvous.api import RendezvousHandler
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousBackend

from mbr_launch.cluster import listen, storevalue, torch_internals
from mbr_launch.cluster.storevalue import Sealer
from mbr_launch.cluster.torch_internals import Patch
from mbr_launch.config.build import C10D_PORT


def create_handler(params: RendezvousParameters,
                   sealer: Sealer | None = None) -> tuple[RendezvousHandler | None, Patch]:
    """torch's c10d handler over our store, or None where torch's registry should make it; and the
    ``store_socket`` record."""
    if params.get("store_type", "tcp").strip().lower() != "tcp":
        return None, torch_internals.STORE_SOCKET.refused("store_type is not tcp: torch's registry makes the store")
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler as torch_handler

    patch = torch_internals.STORE_SOCKET.check(None)
    if not patch.installed:  # a torch without the parts this mirrors: its registry decides everything
        return None, patch
    store = make_store(params)
    if store is None:
        return None, torch_internals.STORE_SOCKET.refused("this torch's TCPStore takes no master_listen_fd")
    return torch_handler(store, backend(store, params.run_id, sealer or Sealer()), params), patch


def make_store(params: RendezvousParameters) -> TCPStore | None:
    """The rendezvous store, served here when this is the endpoint's host and the port is free, else a client;
    None when this torch cannot take a listening socket."""
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

    host, port = parse_rendezvous_endpoint(params.endpoint, default_port=C10D_PORT)
    timeout = datetime.timedelta(seconds=_read_timeout(params))
    forced = params.get_as_bool("is_host")
    # torch's own test of this machine (its name, its addresses, loopback): the same agent hosts as under torchrun
    if forced if forced is not None else torch_internals.matches_this_machine(host):
        # A standalone job's store is for this machine only: loopback, where torchrun listens on every address.
        fd = listen.listening_fd(port, host, loopback=bool(params.get_as_bool("mbr_loopback", False)))
        if fd is not None:
            try:
                return TCPStore(host, port, is_master=True, multi_tenant=True, timeout=timeout,
                                master_listen_fd=fd)
            except TypeError:  # a torch before master_listen_fd: its own registry path
                listen.close_fd(fd)
                return None
            except (ValueError, RuntimeError, TimeoutError) as err:
                listen.close_fd(fd)
                if forced:
                    raise RendezvousConnectionError(f"cannot host the rendezvous store on port {port}: {err}")
        elif forced:
            raise RendezvousConnectionError(f"cannot host the rendezvous store: port {port} is taken on this "
                                            "machine (is_host=true)")
    try:  # another agent on this machine hosts it, or it lives elsewhere
        return TCPStore(host, port, is_master=False, multi_tenant=True, timeout=timeout)
    except (ValueError, RuntimeError, TimeoutError) as err:
        raise RendezvousConnectionError(f"cannot connect to the rendezvous store at {host}:{port}: {err}") from err


def _read_timeout(params: RendezvousParameters) -> int:
    value: Any = params.get_as_int("read_timeout", 60)
    if value is None or value <= 0:
        raise ValueError("The read timeout must be a positive integer.")
    return int(value)


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
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

    inner = C10dRendezvousBackend(store, run_id)
    return SealedBackend(inner, run_id, sealer) if sealer.enabled else inner

