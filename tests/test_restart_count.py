"""The job-wide restart budget on a real TCPStore: a failure that every node reports at once (a round stopped
by a verdict the culprit's node did not act on, which each of the others then reports) spends one restart, not
one per reporter; a restart of one node's ranks (--restart-scope node) spends one per restart."""

from __future__ import annotations

import datetime
import threading
from types import SimpleNamespace

import pytest
from torch.distributed import PrefixStore, TCPStore

from mbr_launch.cluster.rendezvous import Rendezvous
from mbr_launch.cluster.storevalue import Sealer

pytestmark = pytest.mark.timeout(120)


def _round(store: TCPStore, index: int) -> SimpleNamespace:
    prefix = f"mbr/round/{index}"
    return SimpleNamespace(store=PrefixStore(f"torch/{index}", store), control=PrefixStore(prefix, store),
                           control_prefix=prefix, sealer=Sealer())


def test_a_failure_reported_by_every_node_at_once_spends_one_restart(port):
    server = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, 
                      timeout=datetime.timedelta(seconds=30))
    agents = [Rendezvous(SimpleNamespace(rendezvous=SimpleNamespace(run_id="job1"))) for _ in range(16)]
    clients = [TCPStore("127.0.0.1", port, is_master=False, timeout=server.timeout) for _ in agents]
    for index in (0, 1):
        go = threading.Barrier(len(agents))
        totals: list[int] = []

        def report(agent: Rendezvous, client: TCPStore) -> None:
            rnd = _round(client, index)
            go.wait()
            totals.append(agent.count_restart(rnd, startup=False, once_per_round=True))  # type: ignore[arg-type]

        threads = [threading.Thread(target=report, args=pair) for pair in zip(agents, clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert agents[0].counts(_round(server, index)) == (index + 1, 0)  # type: ignore[arg-type]
        assert max(totals) == index + 1
    # A node-scope restart is one node's own: each spends one.
    for agent, client in zip(agents[:3], clients):
        agent.count_restart(_round(client, 2), startup=True, once_per_round=False)  # type: ignore[arg-type]
    assert agents[0].counts(_round(server, 2)) == (2, 3)  # type: ignore[arg-type]
