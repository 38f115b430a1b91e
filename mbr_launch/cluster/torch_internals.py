"""The one place where mbr-launch touches torch's private rendezvous internals.

torch's dynamic rendezvous has no public hook for what the restart speed-ups need. Each use is a *patch*
(``PATCHES``; ``_<name>_missing`` lists the private parts it reads). On a torch lacking a part, that patch
does not install and torch's behaviour stands, never silently: each install returns a ``Patch`` record,
``status()`` checks them on a throwaway handler, the agent says ``lost_line`` at start-up and the doctor
checks. torch is imported inside the functions only: the doctor imports this module without it.
"""

from __future__ import annotations

import inspect
import pickle
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from types import ModuleType
from typing import Any, Callable, Sequence

_MODULE = "dynamic_rendezvous"  # how the reasons name torch.distributed.elastic.rendezvous.dynamic_rendezvous
SETTLE = 1.0  # seconds after MIN nodes joined before a failure round may close without its last call


@dataclass(frozen=True)
class Patch:
    """Whether one patch took, on one handler or (``status()``) on the torch in use."""

    name: str
    buys: str  # what it gives when installed
    without: str  # what happens instead when it is not: torch's own behaviour
    installed: bool
    why_not: str = ""  # the private part this torch lacks ("" when installed)


@dataclass(frozen=True)
class PatchKind:
    """One patch: its name, what it buys, and the check of the private parts it needs."""

    name: str
    buys: str
    without: str
    missing: Callable[[Any], str | None]  # the part a handler (or torch) lacks; None when all are there
    on_handler: bool = True  # checked on a handler (False: on torch's modules only)

    def took(self) -> Patch:
        return Patch(self.name, self.buys, self.without, installed=True)

    def refused(self, why: str) -> Patch:
        return Patch(self.name, self.buys, self.without, installed=False, why_not=why)

    def check(self, handler: Any) -> Patch:
        """Whether this patch installs on ``handler``; never raises."""
        try:
            why = self.missing(handler)
        except ImportError as err:
            why = f"cannot import torch's {_MODULE}: {err}"
        except Exception as err:  # a torch shaped unlike any we know: report it, do not crash the launch
            why = f"{type(err).__name__}: {err}"
        return self.took() if why is None else self.refused(why)


# ---- checks: what each patch needs ---------------------------------------------------------------------

def _dynamic() -> ModuleType:
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    return dynamic_rendezvous


def _lacks(obj: Any, owner: str, *names: str) -> str | None:
    for name in names:
        if not hasattr(obj, name):
            return f"{owner} has no {name}"
    return None


def _state_lacks(dr: ModuleType, *fields: str) -> str | None:
    if not hasattr(dr, "_RendezvousState"):
        return f"{_MODULE} has no _RendezvousState"
    return _lacks(dr._RendezvousState(), "_RendezvousState", *fields)


def _event_names_missing(_handler: Any) -> str | None:
    dr = _dynamic()
    return None if callable(getattr(dr, "get_method_name", None)) else f"{_MODULE} has no get_method_name"


def _join_wake_missing(handler: Any) -> str | None:
    dr = _dynamic()
    holder = getattr(handler, "_state_holder", None)
    why = (_lacks(dr, _MODULE, "_delay")
           or _lacks(handler, "the handler", "_store", "_state_holder", "_op_executor")
           or _lacks(holder, "its state holder", "sync", "state", "_last_sync_time", "_backend")
           or _lacks(holder._backend, "the state backend", "_store"))
    if why is None and getattr(handler._op_executor, "_state_holder", None) is not holder:
        # the wake announces a completed round from the holder's sync(), which must be the executor's
        return "the handler's executor syncs through another state holder"
    return why


def _early_close_missing(handler: Any) -> str | None:
    dr = _dynamic()
    why = (_lacks(dr, _MODULE, "_RendezvousJoinOp", "_Action", "_RendezvousContext")
           or _lacks(dr._Action, "_Action", "SYNC", "KEEP_ALIVE", "MARK_RENDEZVOUS_COMPLETE")
           or _lacks(handler, "the handler", "_op_executor")
           or _lacks(handler._op_executor, "its executor", "run")
           or _state_lacks(dr, "closed", "complete", "participants", "deadline", "wait_list"))
    if why is None:  # the join operation's context: what the early close reads
        params = inspect.signature(dr._RendezvousContext.__init__).parameters
        gone = [name for name in ("node", "state", "settings") if name not in params]
        why = f"_RendezvousContext has no {gone[0]}" if gone else None
    return why


def _leave_missing(handler: Any) -> str | None:
    dr = _dynamic()
    return (_lacks(dr, _MODULE, "_RendezvousExitOp", "_Action")
            or _lacks(dr._Action, "_Action", "REMOVE_FROM_WAIT_LIST")
            or _lacks(handler, "the handler", "_stop_heartbeats", "_op_executor")
            or _lacks(handler._op_executor, "its executor", "run"))


def _state_reads_missing(handler: Any) -> str | None:
    dr = _dynamic()
    return (_lacks(handler, "the handler", "_store", "_heartbeat_lock", "_state_holder")
            or _state_lacks(dr, "participants", "wait_list", "complete"))


def _store_address_missing(handler: Any) -> str | None:
    return _lacks(handler, "the handler", "_store")


def _store_socket_missing(_handler: Any) -> str | None:
    from torch.distributed import TCPStore
    from torch.distributed.elastic.rendezvous import utils

    why = _lacks(utils, "rendezvous.utils", "_matches_machine_hostname")
    # pybind's signature line lists the keyword: there is no other way to ask a C++ constructor
    if why is None and "master_listen_fd" not in (TCPStore.__init__.__doc__ or ""):
        why = "TCPStore takes no master_listen_fd"
    return why


EVENT_NAMES = PatchKind(
    "event_names",
    "torch names each rendezvous event from a frame lookup, not inspect.stack (most of a crowded join's CPU)",
    "every rendezvous event reads source files (about 1.6 ms of CPU each): a crowded join is slower",
    _event_names_missing, on_handler=False)
JOIN_WAKE = PatchKind(
    "join_wake",
    "a waiting join learns at once that its round is complete",
    "a waiting join notices its round's completion at its next poll, up to 1 s later",
    _join_wake_missing)
EARLY_CLOSE = PatchKind(
    "early_close",
    "a round after a failure closes once every announced node has joined",
    "a round after a failure waits torch's whole last call (last_call_timeout, 30 s by default)",
    _early_close_missing)
LEAVE = PatchKind(
    "leave",
    "a node that leaves (excluded, or stopped alone by a signal) is out of the rendezvous at once",
    "the other nodes drop a node that leaves only when its keep-alive expires",
    _leave_missing)
STATE_READS = PatchKind(
    "state_reads",
    "join counts and spare counts read without torch's heartbeat lock",
    "the join line shows no node count and a failure's facts may wait out a keep-alive (5 s by default)",
    _state_reads_missing)
STORE_ADDRESS = PatchKind(
    "store_address",
    "the rendezvous store's address: watcher connections opened while joining, job keys read after the job",
    "the first restart opens its watcher connections then, and a late node cannot read why the job ended",
    _store_address_missing)
STORE_SOCKET = PatchKind(
    "store_socket",
    "the store's host listens on our own socket (IPv4 for an IPv4 endpoint): no DNS lookup per connection",
    "torch's registry makes the store: its server may stop for a reverse DNS lookup of each connecting agent",
    _store_socket_missing, on_handler=False)
PATCHES: tuple[PatchKind, ...] = (EVENT_NAMES, JOIN_WAKE, EARLY_CLOSE, LEAVE, STATE_READS, STORE_ADDRESS,
                                  STORE_SOCKET)


# ---- status for the torch in use -----------------------------------------------------------------------

def status() -> list[Patch]:
    """For the torch in use: whether each patch installs, checked on a throwaway handler."""
    try:
        handler, failed = _probe_handler(), ""
    except Exception as err:  # cannot even make a handler: every check on one says so
        handler, failed = None, f"cannot make torch's c10d handler to look at: {type(err).__name__}: {err}"
    return [kind.refused(failed) if failed and kind.on_handler else kind.check(handler) for kind in PATCHES]


def _probe_handler() -> Any:
    from torch.distributed import HashStore
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

    dr = _dynamic()
    # Node ids of its own, so the agent's real handler still gets torch's first one (host_pid_0 in its logs).
    generator = getattr(dr, "_NodeDescGenerator", None)
    probe = type("_ProbeHandler", (dr.DynamicRendezvousHandler,),
                 {"_node_desc_generator": generator()} if generator else {})
    store = HashStore()
    return probe.from_backend("mbr-probe", store, C10dRendezvousBackend(store, "mbr-probe"), 1, 1,
                              local_addr="mbr-probe")


def not_installed(patches: Sequence[Patch]) -> dict[str, str]:
    return {p.name: p.why_not for p in patches if not p.installed}


def lost_line(patches: Sequence[Patch], version: str | None = None) -> str | None:
    """One line naming the patches that do not install and what that loses; None when all do."""
    lost = [p for p in patches if not p.installed]
    if not lost:
        return None
    return f"torch {version or torch_version()}: " + "; ".join(f"{p.name} not installed ({p.why_not}): {p.without}"
                                                               for p in lost)


def torch_version() -> str:
    import torch

    return str(torch.__version__)


# ---- event_names ---------------------------------------------------------------------------------------

def replace_event_names() -> Patch:
    """torch's ``get_method_name``, which names every rendezvous event from ``inspect.stack`` (reading source:
    most of a crowded join's CPU), replaced by ours: the same answer from ``sys._getframe``."""
    patch = EVENT_NAMES.check(None)
    if patch.installed:
        dr = _dynamic()
        if dr.get_method_name is not get_method_name:
            dr.get_method_name = get_method_name
    return patch


def get_method_name(depth: int = 2) -> str:
    # Frame 0 is this function, as inspect.stack()[0] is torch's own: the same frame ``depth`` up.
    try:
        return sys._getframe(depth).f_code.co_name
    except ValueError:  # a stack shallower than depth
        return "no_method_name"


# ---- join_wake -----------------------------------------------------------------------------------------

def state_holder(handler: Any) -> Any:
    """The handler's state holder; its executor calls ``holder.sync()``, so an instance attribute replaces it."""
    return handler._state_holder


def holder_store(holder: Any) -> Any:
    return holder._backend._store


def mark_state_stale(holder: Any) -> None:
    """Make the holder's next ``sync()`` read the store: torch's one-second cache would say "not complete"."""
    holder._last_sync_time = -1


def swap_join_pause(pause: Callable[..., None]) -> Callable[..., None] | None:
    """Put ``pause`` in torch's ``_delay``; returns torch's own, or None when ``pause`` is there already."""
    dr = _dynamic()
    current = dr._delay
    if current is pause:
        return None
    dr._delay = pause
    return current


# ---- early_close ---------------------------------------------------------------------------------------

def may_close(state: Any, node: Any, settings: Any, *, now: datetime | None = None) -> bool:
    """Whether a failure round may close without torch's last call (dead time after a failure: every live node
    is in the state already): this node is in, MIN are, no one waits or spares, and ``SETTLE`` has passed
    (a spare's move to the participants takes two writes)."""
    if state.closed or state.complete or node not in state.participants or state.deadline is None:
        return False
    if not settings.min_nodes <= len(state.participants) <= settings.max_nodes:
        return False
    if state.wait_list or getattr(state, "redundancy_list", ()):
        return False
    now = now or datetime.now(timezone.utc)
    min_reached = state.deadline - settings.timeout.last_call  # torch sets the deadline when MIN joined
    return now >= min_reached + timedelta(seconds=SETTLE)


def close_joins_early(handler: Any, *, active: Callable[[], bool],
                      may_close: Callable[[Any, Any, Any], bool] = may_close) -> Patch:
    """Wrap the handler's executor: while ``active()`` (rounds after this agent's first), a join step that
    would only wait (sync, keep-alive) marks the round complete instead when ``may_close(state, node, settings)``."""
    patch = EARLY_CLOSE.check(handler)
    if patch.installed:
        handler._op_executor = _JoinExecutor(handler._op_executor, _dynamic(), active, may_close)
    return patch


class _JoinExecutor:
    def __init__(self, inner: Any, dr: ModuleType, active: Callable[[], bool],
                 may_close: Callable[[Any, Any, Any], bool]) -> None:
        self._inner, self._dr, self._active, self._may_close = inner, dr, active, may_close

    def run(self, op: Any, deadline: float, update_deadline: Any = None) -> None:
        if isinstance(op, self._dr._RendezvousJoinOp) and self._active():
            op = _EarlyClose(op, self._dr._Action, self._may_close)
        return self._inner.run(op, deadline, update_deadline)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _EarlyClose:
    def __init__(self, inner: Callable[[Any, float], Any], actions: Any,
                 may_close: Callable[[Any, Any, Any], bool]) -> None:
        self._inner, self._actions, self._may_close = inner, actions, may_close

    def __call__(self, ctx: Any, deadline: float) -> Any:
        action = self._inner(ctx, deadline)
        if action in (self._actions.SYNC, self._actions.KEEP_ALIVE) and \
                self._may_close(ctx.state, ctx.node, ctx.settings):
            return self._actions.MARK_RENDEZVOUS_COMPLETE
        return action


# ---- leave ---------------------------------------------------------------------------------------------

def leave(handler: Any, *, timeout: float) -> str | None:
    """Out of the rendezvous without closing it: torch's exit op, also out of the wait or spares' list (torch
    leaves that to the keep-alive's expiry, holding up an early close). Why not; None: it left."""
    patch = LEAVE.check(handler)
    if not patch.installed:
        return f"{patch.name} not installed: {patch.why_not}"
    exit_op, act = _dynamic()._RendezvousExitOp(), _dynamic()._Action
    outs = {"wait_list": act.REMOVE_FROM_WAIT_LIST, "redundancy_list": getattr(act, "REMOVE_FROM_REDUNDANCY_LIST", 0)}

    def everywhere(ctx: Any, deadline: float) -> Any:
        action = exit_op(ctx, deadline)
        found = [out for name, out in outs.items() if out and ctx.node in getattr(ctx.state, name, ())]
        return found[0] if action == act.FINISH and found else action

    try:
        handler._stop_heartbeats()
        handler._op_executor.run(everywhere, time.monotonic() + timeout)
    except Exception as err:  # the store is gone, or the exit timed out: our keep-alive expires instead
        return f"{type(err).__name__}: {err}"
    return None


# ---- state_reads, store_address ------------------------------------------------------------------------

@dataclass(frozen=True)
class StateView:
    members: tuple[tuple[str, int], ...]  # the round's nodes: (address, group rank), sorted
    waiting: tuple[str, ...]  # the wait list's addresses: nodes queued behind a complete round
    spares: tuple[str, ...]  # the redundancy list's: nodes beyond --nnodes MAX (empty where torch has none)
    complete: bool


def handler_store(handler: Any) -> Any | None:
    return getattr(handler, "_store", None)


def decode_state(blob: bytes) -> StateView:
    return _view(pickle.loads(blob))


def empty_state() -> bytes:
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _RendezvousState
    return pickle.dumps(_RendezvousState())


def joined_round(handler: Any) -> int | None:
    value = getattr(getattr(getattr(handler, "_state_holder", None), "state", None), "round", None)
    return value if isinstance(value, int) else None


def read_state_locked(handler: Any) -> StateView:
    """The handler's own fresh read of the state, under its heartbeat lock (slow: for when ours failed)."""
    with handler._heartbeat_lock:
        handler._state_holder.sync()
        return _view(handler._state_holder.state)


def _view(state: Any) -> StateView:
    wait, spare = getattr(state, "wait_list", ()), getattr(state, "redundancy_list", ())
    return StateView(members=tuple(sorted((str(n.addr), int(r)) for n, r in state.participants.items())),
                     waiting=tuple(str(n.addr) for n in wait), spares=tuple(str(n.addr) for n in spare),
                     complete=bool(state.complete))


# ---- store_socket --------------------------------------------------------------------------------------

def matches_this_machine(host: str) -> bool:
    """torch's own test of whether ``host`` is this machine (its name, its addresses, loopback)."""
    from torch.distributed.elastic.rendezvous.utils import _matches_machine_hostname
    return bool(_matches_machine_hostname(host))
