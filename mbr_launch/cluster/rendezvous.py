"""Rendezvous through torch's own elastic machinery, with fresh state every round.

torchrun reuses the store and its port across rounds, so a restarted round can read the previous round's keys
(pytorch#135712). Here every round gets a prefixed store for the agents, a fresh MASTER_PORT for the workers
(static: the cleared static store, ``cluster.workerstore``), an agreed rank layout, and control keys of its own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import time
import uuid
from typing import Any, Callable

from torch.distributed import PrefixStore, Store, TCPStore
from torch.distributed.elastic.rendezvous import RendezvousClosedError, RendezvousParameters

try:  # torch >= 2.3: what a node still waiting to join gets when the rendezvous is closed
    from torch.distributed.elastic.rendezvous.api import RendezvousGracefulExitError
except ImportError:  # pragma: no cover - older torch raises RendezvousClosedError there
    RendezvousGracefulExitError = RendezvousClosedError  # type: ignore[misc,assignment]
from torch.distributed.elastic.rendezvous.api import RendezvousHandler
from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

from mbr_launch.cluster import fastround, joining, layout, rdzvstore, storeclients, torch_internals, workerstore
from mbr_launch.cluster.jobstore import FAILED_KEY, RESTARTS_KEY, STARTUP_RESTARTS_KEY, JobStore, node_failures_key
from mbr_launch.cluster.storevalue import Sealer
from mbr_launch.cluster.joining import JoinCounter, JoinState, join_state
from mbr_launch.cluster.round import Round
from mbr_launch.cluster.torch_internals import Patch
from mbr_launch.config.model import LaunchConfig


# Connections opened for the pool while the agent joins: the join progress line's and the first round's stop
# listener's. Each costs a reverse lookup in torch's client: more made the launch burst slower.
WATCHER_CONNECTIONS = 2


class RendezvousFailed(RuntimeError):
    """The rendezvous could not complete (timeout, closed, store unreachable)."""


class RendezvousClosed(RendezvousFailed):
    """The other nodes closed the rendezvous: the job ended while this node waited to join a round."""


def release_control(store: Store) -> None:
    """Give a ``connect_control`` connection back for a later round's watcher (only one that still works)."""
    storeclients.POOL.release(_base_store(store))


class Rendezvous:
    def __init__(self, cfg: LaunchConfig, sealer: Sealer | None = None) -> None:
        self._cfg = cfg
        # the job's secret (or none), for every round and reader made here: seals our values and torch's state
        self.sealer = sealer or Sealer()
        self._handler: RendezvousHandler | None = None
        self._state_reader: JoinCounter | None = None  # the main thread's own reader of torch's state
        self._waiting_reader: JoinCounter | None = None  # the peer watch's, on a connection of its own
        self._joined = 0
        self._control: TCPStore | None = None  # our own client, for job-level keys
        self._wake: joining.JoinWake | None = None  # ends a join's pauses when its round completes
        self._patches: list[Patch] = []  # what the c10d handler was patched with, as each took
        self._job = f"mbr/job/{cfg.rendezvous.run_id}"  # our keys that outlive a round, on the rendezvous store

    # -- construction ----------------------------------------------------------------------------

    def _create_handler(self) -> RendezvousHandler:
        rdzv = self._cfg.rendezvous
        conf = dict(rdzv.conf)
        if rdzv.backend == "c10d":
            # torch's 5 s x 3 keep-alive keeps a dead node in the rendezvous for 15 s; ours follows the
            # peer timeout so the survivors' next round forms as soon as they have noticed the loss.
            interval = max(1, int(rdzv.peer_timeout // 3))  # torch takes whole seconds
            conf.setdefault("keep_alive_interval", interval)
            conf.setdefault("keep_alive_max_attempt", max(2, min(3, int(rdzv.peer_timeout // interval))))
            if rdzv.standalone:
                conf["mbr_loopback"] = "true"  # cluster.rdzvstore: the store listens on 127.0.0.1 only
        params = RendezvousParameters(
            backend=rdzv.backend,
            endpoint=rdzv.endpoint,
            run_id=rdzv.run_id,
            min_nodes=rdzv.min_nodes,
            max_nodes=rdzv.max_nodes,
            local_addr=rdzv.local_addr,
            **conf,
        )
        # Read by torch's next_rendezvous at call time: group rank 0 picks a fresh free port for the workers
        # instead of handing them the agent's own store (the torchrun restart bug).
        os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
        try:
            made, own_socket = rdzvstore.create_handler(params, self.sealer) if rdzv.backend == "c10d" else (None, None)
            if made is None and self.sealer.enabled:
                # torch's registry would make its own backend, which unpickles the state unverified
                why = own_socket.why_not if own_socket is not None else "not the c10d backend"
                raise RendezvousFailed(f"--rdzv-secret-file cannot seal this rendezvous ({why}); drop the secret "
                                       "or use a torch whose TCPStore takes master_listen_fd (2.4 or later)")
            handler = made or get_rendezvous_handler(params)
        except Exception as err:  # torch raises many types here; all mean "cannot start"
            raise RendezvousFailed(f"cannot set up the {rdzv.backend} rendezvous at "
                                   f"{rdzv.endpoint or '(none)'}: {err}") from err
        if own_socket is not None:  # c10d
            self._patches += [
                own_socket,
                # a failure round: no last call for nobody
                torch_internals.close_joins_early(handler, active=lambda: self._joined > 0),
                torch_internals.replace_event_names(),
            ]
            # torch's immediate retry after a lost write of its state is kept on purpose: a random pause there
            # left the state stale, and a joiner lost to the others' keep-alives every time.
        return handler

    @property
    def handler(self) -> RendezvousHandler:
        if self._handler is None:
            self._handler = self._create_handler()
            if self._cfg.rendezvous.backend == "c10d":
                self._patches.append(self._install_wake(self._handler))
        return self._handler

    def _install_wake(self, handler: RendezvousHandler) -> Patch:
        store = torch_internals.handler_store(handler)  # the store the watchers connect to
        if not getattr(store, "port", 0):  # a file store (or no store found: the check says which part)
            why = torch_internals.STORE_ADDRESS.check(handler).why_not or "the rendezvous store is not a TCPStore"
            return torch_internals.JOIN_WAKE.refused(why)
        storeclients.POOL.prefill(store.host, int(store.port), WATCHER_CONNECTIONS)
        patch, self._wake = joining.install_wake(handler, host=store.host, port=int(store.port),
                                                 prefix=f"{self._job}/complete/")
        return patch

    def existing_handler(self) -> RendezvousHandler | None:
        """torch's handler once made, else None: never makes one (for other threads than the joining one)."""
        return self._handler

    @property
    def patches(self) -> tuple[Patch, ...]:
        """The patches of torch's c10d handler, as each took (none before the first join, nor for static)."""
        return tuple(self._patches)

    # -- rounds -----------------------------------------------------------------------------------

    def next_round(self, previous: Round | None = None, skip_fast: str | None = None) -> Round:
        """The next round. After a job-wide restart of ``previous`` its agents try ``cluster.fastround`` first,
        unless ``skip_fast`` says why this agent cannot (then all fall back to the c10d join)."""
        fallback = None
        if previous is not None and self._cfg.rendezvous.backend == "c10d":
            outcome = self._try_fast(previous, skip_fast)
            if isinstance(outcome, fastround.Agreement):
                return self._fast_round(previous, outcome)
            fallback = outcome.reason
        rnd = self._join_c10d()
        return dataclasses.replace(rnd, fallback=fallback) if fallback else rnd

    def _try_fast(self, previous: Round, skip: str | None) -> fastround.Outcome:
        token, nodes = previous.token, previous.group_world_size
        try:
            if skip is not None:
                return fastround.abort(previous.control, skip, token=token, nodes=nodes,
                                       scope=previous.control_prefix, sealer=self.sealer)
            port = restarts = 0
            if previous.group_rank == 0:
                port, restarts = workerstore.pick_master_port(), sum(self._counts(previous.store))
            return fastround.agree(previous.control, group_rank=previous.group_rank, nodes=nodes, token=token,
                                   timeout=self._cfg.rendezvous.peer_timeout, master_port=port, restarts=restarts,
                                   scope=previous.control_prefix, sealer=self.sealer)
        except Exception as err:  # the store went away: the c10d join reports it properly
            return fastround.Fallback(f"fast path failed: {type(err).__name__}: {err}")

    def _fast_round(self, previous: Round, agreed: fastround.Agreement) -> Round:
        base = _base_store(previous.store)
        job = self._job
        store = PrefixStore(f"{job}/fast/{agreed.token}", base)
        prefix = f"{job}/round/{agreed.token}"
        index = self._joined
        self._joined += 1
        return dataclasses.replace(previous, index=index, master_port=agreed.master_port,
                                   restart_count=agreed.restart_count, token=agreed.token, store=store,
                                   control=PrefixStore(prefix, base), control_prefix=prefix, fast=True,
                                   fallback=None)

    def _join_c10d(self) -> Round:
        handler = self.handler
        try:
            with self._wake.waiting() if self._wake else contextlib.nullcontext():
                info: Any = handler.next_rendezvous()
        except (RendezvousClosedError, RendezvousGracefulExitError) as err:
            raise RendezvousClosed("the job ended on the other nodes (the rendezvous was closed) while this node "
                                   "waited to join a round") from err
        except Exception as err:
            raise RendezvousFailed(f"rendezvous failed: {type(err).__name__}: {err}") from err
        if isinstance(info, tuple):  # torch 2.3 returns (store, rank, world_size)
            store, group_rank, group_world_size = info
            bootstrap = None
        else:
            store, group_rank, group_world_size = info.store, info.rank, info.world_size
            bootstrap = info.bootstrap_store_info
        index = self._joined
        self._joined += 1
        if self._cfg.rendezvous.backend == "static":
            # The static store is the same object every round: give each attempt its own key space. It is the
            # workers' store too, at torchrun's MASTER_ADDR:MASTER_PORT (cluster.workerstore).
            store = PrefixStore(f"mbr/attempt{index}", store)
            rnd = self._lay_out(store, index, group_rank, group_world_size,
                                workerstore.static_addr(self._cfg.rendezvous.endpoint), shared=True)
        else:
            if bootstrap is None:
                from torch.distributed.elastic.rendezvous.api import RendezvousStoreInfo

                bootstrap = RendezvousStoreInfo.build(group_rank, store, local_addr=self._cfg.rendezvous.local_addr)
            rnd = self._lay_out(store, index, group_rank, group_world_size, bootstrap.master_addr)
        return dataclasses.replace(rnd, woken=True) if self._wake and self._wake.woken else rnd

    def _lay_out(self, store: Store, index: int, group_rank: int, group_world_size: int,
                 master_addr: str, shared: bool = False) -> Round:
        timeout = datetime.timedelta(seconds=self._cfg.rendezvous.join_timeout)
        store.set_timeout(timeout)
        # torch's round number (from its state, sealed with a secret) names the round in the layout's seal
        scope = f"round{torch_internals.joined_round(self._handler)}" if self._handler is not None else ""
        try:
            lay = layout.agree(store, group_rank, group_world_size, self._cfg.workers.nproc_per_node,
                               lambda: (uuid.uuid4().hex[:12], sum(self._counts(store)),
                                        workerstore.round_port(_base_store(store), self._cfg.rendezvous.run_id)
                                        if shared else workerstore.pick_master_port()),
                               scope=scope, sealer=self.sealer)
        except (layout.LayoutUnreadable, workerstore.NotClearable) as err:
            raise RendezvousFailed(f"rendezvous failed: {err}") from None
        token, restarts, master_port = lay.token, lay.restarts, lay.master_port
        base = _base_store(store)
        prefix = f"{self._job}/round/{token}"
        return Round(index=index, group_rank=group_rank, group_world_size=group_world_size,
                     world_size=sum(lay.sizes), rank_offset=lay.offset(group_rank),
                     master_addr=master_addr, master_port=master_port, restart_count=restarts,
                     token=token, store=store, control=PrefixStore(prefix, base), control_prefix=prefix,
                     store_host=getattr(base, "host", ""), store_port=int(getattr(base, "port", 0)),
                     shared_store=shared, sealer=self.sealer)

    def _counters(self, store: Store) -> JobStore:
        return JobStore(PrefixStore(self._job, _base_store(store)), self._job, self.sealer)

    def _counts(self, store: Store) -> tuple[int, int]:
        counters = self._counters(store)
        return counters.add(RESTARTS_KEY, 0), counters.add(STARTUP_RESTARTS_KEY, 0)

    # -- job-level keys (survive rounds) ----------------------------------------------------------

    def job_store(self, round_store: Store) -> JobStore:
        """Keys that outlive a round (restart and node failure counts, the progress record, the job's stop)."""
        return JobStore(PrefixStore(self._job, _base_store(round_store)), None, self.sealer)

    def counts(self, rnd: Round) -> tuple[int, int]:
        return self._counts(rnd.store)

    def count_restart(self, rnd: Round, *, startup: bool, once_per_round: bool) -> int:
        """Spend one restart of the job-wide budget (``once_per_round``: only the round's first reporter does);
        returns the total restarts."""
        if once_per_round:
            # A value of this call's own: with one value for all, each would read its own write back as the first.
            mine = uuid.uuid4().hex
            first, _ = JobStore.of_round(rnd).claim(FAILED_KEY, mine)
            if not first:
                return sum(self.counts(rnd))
        self._counters(rnd.store).add(STARTUP_RESTARTS_KEY if startup else RESTARTS_KEY, 1)
        return sum(self.counts(rnd))

    def count_node_failure(self, rnd: Round, node: str) -> int:
        return self._counters(rnd.store).add(node_failures_key(node), 1)

    def leave(self) -> str | None:
        """Leave the rendezvous without closing it for the others; returns why it could not, None when it left.
        Where it fails, our keep-alive expires and the others drop us."""
        handler = self._handler
        if handler is None:
            return None
        why = torch_internals.leave(handler, timeout=10)
        self._handler = None
        return why

    def spare_count(self) -> int:
        """Agents waiting outside the current round: the wait list plus spares beyond --nnodes MAX. Read from
        torch's state key, not the handler's methods: they take the lock its keep-alive holds through a write."""
        state = self.state()  # None also while there is no handler yet
        if state is not None:
            return state.outside
        handler = self._handler
        try:
            return join_state(torch_internals.read_state_locked(handler)).outside if handler is not None else 0
        except Exception:  # the store is gone, or a torch without these parts (reported at start-up)
            return self.num_nodes_waiting()

    def state(self) -> JoinState | None:
        if self._state_reader is None:
            self._state_reader = JoinCounter(lambda: self._handler, self.sealer, shared=True)
        return self._state_reader.read()

    def job_get(self, key: str) -> bytes | None:
        """A key of the job store read without a round (a spare, after the job closed); None when unknown."""
        store = torch_internals.handler_store(self._handler)
        if store is None:
            return None
        try:
            return self.job_store(store).read_if_set(key)  # None too for a value no agent wrote
        except Exception:  # the store's host has gone: nothing more to learn
            return None

    def num_nodes_waiting(self) -> int:
        try:
            return self._handler.num_nodes_waiting() if self._handler is not None else 0
        except Exception:
            return 0

    def waiting_counter(self) -> Callable[[], int]:
        """``num_nodes_waiting`` for the peer watch: on a connection of its own, without the handler's lock."""
        if self._waiting_reader is None:
            self._waiting_reader = JoinCounter(lambda: self._handler, self.sealer)
        reader = self._waiting_reader

        def count() -> int:
            state = reader.read()
            return state.waiting if state is not None else self.num_nodes_waiting()

        return count

    def shutdown(self, *, linger: float = 0.0) -> None:
        """Close the rendezvous for every node. ``linger``: when agents wait outside, stay that long so they
        read "closed" rather than find the store gone."""
        if self._handler is None:
            return
        waiting = self.spare_count() if linger > 0 else 0
        try:
            self._handler.shutdown()
        except Exception:
            pass
        if waiting:
            time.sleep(linger)


def _base_store(store: Store) -> Store:
    while isinstance(store, PrefixStore):
        store = store.underlying_store
    return store
