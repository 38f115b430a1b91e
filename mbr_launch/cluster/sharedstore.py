"""The static rendezvous store as the workers' store too, as torchrun shares it (issue #38).

With ``--master-addr``/``--master-port`` (or ``--rdzv-backend static`` and an endpoint) torchrun gives the
workers ``MASTER_ADDR``/``MASTER_PORT`` = that endpoint and ``TORCHELASTIC_USE_AGENT_STORE=True``: torch's
``tcp://`` and ``env://`` handlers then connect to the agent's store as clients instead of listening. Older
scripts build their init method from the address and port they gave the launcher, so that port must be the
workers' store. torch 2.14 honours the flag only for ``MASTER_ADDR:MASTER_PORT`` itself
(``torch.distributed.rendezvous._agent_store_serves``): a ``tcp://`` init at the static port with another
``MASTER_PORT`` makes rank 0 listen there, on a port the agent holds (EADDRINUSE).

torchrun keeps the workers' keys of every attempt in that store (torch 2.13 and 2.14 add no per-attempt prefix:
``_create_c10d_store`` says so), so a restarted attempt reads the previous attempt's keys: gloo's rank
addresses (``default_pg/0//cpu//0/<rank>``) may still name the dead attempt's sockets when a rank reads them,
and its ``init_process_group`` retries them until its timeout (pytorch#135712). Measured under torchrun 2.13,
2 gloo ranks, rank 1 failing once: of 6 runs, 1 restarted; 2 ended with "Gloo connectFullMesh failed ...
Connection refused" at the old address, 3 were still in the restarted init when killed. Here group rank 0's agent deletes every key the workers wrote before the next round's workers start:
at that point every node has stopped its workers (each joins the next round only after), and none has started
new ones (they wait for the layout that group rank 0 publishes after this). The agents' own keys lie under
``mbr/``, torch's static handler's ``<run id>/`` and ``torch.rendezvous.<run id>``; every other key is the
workers'.
"""

from __future__ import annotations

from typing import Any

AGENT_PREFIX = "mbr/"  # every key of ours on the raw store (job keys, round control, layout)


class NotClearable(RuntimeError):
    """The static store cannot list its keys (a torch without ``Store.list_keys``): says what to do."""


def static_addr(endpoint: str) -> str:
    """The workers' MASTER_ADDR for a static rendezvous: the endpoint's host as given, as torchrun passes it
    (torch 2.14 compares it with the init method's host as text)."""
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

    return parse_rendezvous_endpoint(endpoint, default_port=-1)[0]


def agent_prefixes(run_id: str) -> tuple[str, ...]:
    """Key prefixes of the agents on the static store: ours, torch's static handler's (its run id), and the
    c10d state key that the agent's readers of torch's rendezvous state (``cluster.joining``) leave there."""
    return AGENT_PREFIX, f"{run_id}/", f"torch.rendezvous.{run_id}"


def clear_worker_keys(store: Any, keep: tuple[str, ...]) -> int:
    """Delete every key of ``store`` (the raw TCPStore, no prefix) that starts with none of ``keep``; returns
    how many were deleted."""
    try:
        keys = store.list_keys()
    except (AttributeError, RuntimeError) as err:  # RuntimeError: a store type that does not list (torch says so)
        raise NotClearable(f"the static store cannot list the workers' keys to clear them between rounds ({err}); "
                           "use --rdzv-backend c10d, or a torch whose TCPStore has list_keys") from None
    deleted = 0
    for key in keys:
        if isinstance(key, str) and not key.startswith(keep) and store.delete_key(key):
            deleted += 1
    return deleted


def round_port(store: Any, run_id: str) -> int:
    """Group rank 0's MASTER_PORT for a round on the static store ``store`` (raw): its own port, once the
    previous round's worker keys are gone."""
    clear_worker_keys(store, agent_prefixes(run_id))
    return int(store.port)
