"""``mbr-launch store``: the rendezvous store served apart from the training nodes, for real (its use by agents
whose store host is lost is the fault matrix's ``store_apart_node_lost``)."""

from __future__ import annotations

import datetime
import signal
import subprocess

import pytest
from torch.distributed import TCPStore

from testkit.helpers import LAUNCHER, REPO, free_port, launcher_env

pytestmark = [pytest.mark.timeout(60), pytest.mark.processes]


def _store(port: int) -> subprocess.Popen:
    return subprocess.Popen([*LAUNCHER, "store", "--port", str(port), "--host", "127.0.0.1"], cwd=REPO,
                            env=launcher_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def test_the_store_serves_refuses_a_taken_port_and_stops_on_sigterm():
    port = free_port()
    store = _store(port)
    try:
        assert store.stdout is not None
        line = store.stdout.readline()
        assert f"--rdzv-backend c10d --rdzv-endpoint 127.0.0.1:{port}" in line, line
        client = TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=10))
        client.set("job/key", "value")
        assert client.get("job/key") == b"value"
        second = _store(port)
        out, err = second.communicate(timeout=30)
        assert second.returncode == 2, (out, err)
        assert err.strip().splitlines()[-1] == (f"mbr-launch: error: cannot serve the rendezvous store: port {port} "
                                               "is taken on this host (another store, or another program): pick "
                                               "a free one with --port"), err
        store.send_signal(signal.SIGTERM)
        out, err = store.communicate(timeout=20)
        assert store.returncode == 0, err
        assert out.strip().endswith("mbr-launch store: stopped by SIGTERM"), out
    finally:
        if store.poll() is None:
            store.kill()
            store.communicate()
