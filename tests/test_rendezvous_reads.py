"""Our reads of torch's rendezvous state never wait on torch's keep-alive.

torch's handler guards its own state reads with its heartbeat lock, which its keep-alive thread holds for the
whole compare-and-set retry loop of one keep-alive (up to the keep-alive interval when many agents write at
once). A failure's facts and the fast path ask how many nodes wait outside the round: through the handler
that question waited out the loop (16 agents on 2 cores: the stop went out 5 s after the failure). A real
one-node c10d rendezvous on this machine, with the lock held as the keep-alive thread would hold it."""

from __future__ import annotations

import threading

import pytest

from mbr_launch.api import build_launch_config
from mbr_launch.cluster.rendezvous import Rendezvous
from testkit.helpers import free_port

pytestmark = pytest.mark.timeout(60)


def test_spare_and_waiting_counts_do_not_wait_for_the_keep_alive_lock(tmp_path):
    port = free_port()
    (tmp_path / "train.py").write_text("pass\n")
    cfg = build_launch_config(cli={"nnodes": "1", "rdzv_backend": "c10d", "rdzv_endpoint": f"127.0.0.1:{port}",
                                   "rdzv_id": "reads", "log_dir": str(tmp_path)},
                              script=str(tmp_path / "train.py"), environ={})
    rendezvous = Rendezvous(cfg)
    try:
        rendezvous.next_round()
        handler = rendezvous.handler
        counts: dict[str, int] = {}
        waiting = rendezvous.waiting_counter()
        with handler._heartbeat_lock:  # as torch's keep-alive thread holds it through a contended write
            reader = threading.Thread(target=lambda: counts.update(spares=rendezvous.spare_count(),
                                                                   waiting=waiting()), daemon=True)
            reader.start()
            reader.join(5)
            assert not reader.is_alive(), "the count waited for torch's heartbeat lock"
        assert counts == {"spares": 0, "waiting": 0}
    finally:
        rendezvous.shutdown()
