"""A join's one-second pauses end when its round completes (``cluster.joining``): the agent whose write of
the completed state went through sets a key that the waiting agents' pauses wait for."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from torch.distributed import TCPStore

from mbr_launch.cluster import joining, storeclients
from testkit.eventlog import read_events

from testkit.helpers import finish, free_port, launcher_env

pytestmark = pytest.mark.timeout(120)
PREFIX = "mbr/job/job/complete/"  # what Rendezvous gives: its job prefix, then complete/


@dataclass
class _State:
    round: int = 3
    complete: bool = False


class _Holder:
    """torch's state holder as far as JoinWake sees it: ``state`` and ``sync()`` (True: our write went through)."""

    def __init__(self) -> None:
        self.state = _State()
        self.writes = 0
        self._last_sync_time = 123.0  # torch serves reads within a second of this from its cache

    def sync(self) -> bool:
        self.writes += 1
        return True


@pytest.fixture
def store():
    port = free_port()
    server = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    storeclients.POOL.release(TCPStore("127.0.0.1", port, is_master=False))  # the idle connection a pause takes
    yield server, port
    while storeclients.POOL.take_idle("127.0.0.1", port) is not None:
        pass


def test_a_pause_ends_when_another_agent_completes_the_round(store):
    server, port = store
    waiting, completing = _Holder(), _Holder()
    wake = joining.JoinWake(waiting, server, "127.0.0.1", port, PREFIX)
    completer = joining.JoinWake(completing, server, "127.0.0.1", port, PREFIX)
    completing.sync()  # a write of a state that is not complete yet announces nothing
    assert not server.check(["mbr/job/job/complete/3"])

    def complete() -> None:
        completing.state.complete = True
        completing.sync()  # torch's executor calls holder.sync(): the wrapped one

    timer = threading.Timer(0.3, complete)
    timer.start()
    with wake.waiting():
        wake.pause(30.0)  # would be 30 s without the key
    timer.join()
    assert wake.woken and completer._announced == 3
    assert storeclients.POOL.idle("127.0.0.1", port) == 1  # the connection went back to the pool
    # torch's next read goes to the store: its cache still says "not complete" (a second of spinning else)
    assert waiting._last_sync_time == -1


def test_a_rounds_key_ends_one_pause_only(store, monkeypatch):
    server, port = store
    holder = _Holder()
    server.set("mbr/job/job/complete/3", b"1")  # say the read after the wake still showed round 3 open
    slept: list[float] = []
    monkeypatch.setattr(joining, "_torch_delay", slept.append)
    wake = joining.JoinWake(holder, server, "127.0.0.1", port, PREFIX)
    wake.pause(1.0)
    assert wake.woken and slept == []
    wake.pause(1.0)  # the key exists for good: waiting on it again would spin
    assert slept == [1.0]


def test_without_a_completion_the_pause_is_torchs(store):
    server, port = store
    wake = joining.JoinWake(_Holder(), server, "127.0.0.1", port, PREFIX)
    with wake.waiting():
        wake.pause(0.2)
    assert not wake.woken
    assert storeclients.POOL.idle("127.0.0.1", port) == 1  # a timed-out wait answered: kept


def test_a_spare_of_a_complete_round_does_not_spin(store, monkeypatch):
    server, port = store
    holder = _Holder()
    holder.state.complete = True  # the key of this round exists: waiting for it would return at once
    server.set("mbr/job/job/complete/3", b"1")
    slept: list[float] = []
    monkeypatch.setattr(joining, "_torch_delay", slept.append)
    wake = joining.JoinWake(holder, server, "127.0.0.1", port, PREFIX)
    wake.pause(1.0)
    assert slept == [1.0] and not wake.woken


@pytest.mark.processes
def test_a_late_agent_wakes_the_waiting_one(tmp_path: Path):
    """Two real agents: the first waits in the join until the second arrives; its join ends on the key."""
    port, logs = free_port(), tmp_path / "logs"
    script = tmp_path / "s.py"
    script.write_text("pass\n")
    cmd = [sys.executable, "-m", "mbr_launch", "--nnodes", "2", "--nproc-per-node", "1", "--standby", "off",
           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"wake{port}",
           "--log-dir", str(logs), str(script)]
    first = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=launcher_env(),
                             start_new_session=True)
    try:
        for _ in range(600):  # the first agent has started (its run folder exists): it joins and waits
            if list(logs.glob("*/events.jsonl")) or first.poll() is not None:
                break
            time.sleep(0.1)
        time.sleep(2.0)  # then it pauses a few times in the join
        second = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=launcher_env(), start_new_session=True)
        errs = [finish(proc, 90)[1] for proc in (first, second)]
        assert first.returncode == second.returncode == 0, errs
    finally:
        if first.poll() is None:  # a failed assertion above: never leave it running
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
    joins = [e for p in logs.glob("*/events.jsonl") for e in read_events(p) if e["event"] == "rendezvous"]
    assert len(joins) == 2, joins
    # The agent that waited learnt of the completion from the key; the one that completed the round did not wait.
    assert sorted(bool(e.get("woken")) for e in joins) == [False, True], joins
