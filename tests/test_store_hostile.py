"""Issue #29: what a neighbour who can reach the rendezvous store's port writes there. Every value an agent
reads from the store goes through ``cluster.storevalue`` (bounded, any parser error a refusal, numbers finite
and in range, strings one line with control characters shown); with ``--rdzv-secret-file`` every value, torch's
pickled state included, must carry the job's HMAC. The last test is the attack itself, by another user
(uid 65534) through torch's own TCPStore client, against two real agents."""

from __future__ import annotations

import base64
import datetime
import json
import os
import pickle
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
from torch.distributed import PrefixStore, TCPStore

from mbr_launch.cluster import inquiry, listen, layout, rdzvstore, storevalue
from mbr_launch.cluster.jobstore import JobStore
from mbr_launch.cluster.stops import StopMessage, publish_stop, read_stop
from mbr_launch.config.secret import SecretFileError, read_secret
from mbr_launch.decide.verdict_codec import verdict_from_dict
from testkit.helpers import SCRIPTS, free_port, launcher_env

pytestmark = pytest.mark.timeout(60)
SECRET = b"0123456789abcdef0123456789abcdef"
DEEP = "[" * 100_000 + "]" * 100_000


@pytest.fixture
def store():
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=5))
    yield server


def _round(store: TCPStore, prefix: str = "mbr/job/j/round/t1", secret: bytes | None = None) -> SimpleNamespace:
    return SimpleNamespace(control=PrefixStore(prefix, store), control_prefix=prefix, group_world_size=2,
                           sealer=storevalue.Sealer(secret))


# ---- one decoder --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("raw, why", [
    (DEEP, "not readable JSON"),  # RecursionError, which the old decoders (except ValueError) let through
    ('{"backoff": NaN}', "non-finite"),
    (b"\xff\xfe{}", "not readable JSON"),
    ("[" * 20 + "]" * 20, "nested deeper"),
    ("x" * (storevalue.MAX_BYTES + 100), "over the bound"),
])
def test_the_decoder_refuses_with_a_reason(raw, why):
    with pytest.raises(storevalue.RefusedValue, match=why):
        storevalue.decode_json(raw)


def test_a_stop_message_cannot_spin_flood_or_escape():
    """NaN backoff (1 MB/s of "restarting in nan s"), a 7 MB reason, escape sequences, deep JSON."""
    msg = StopMessage.decode(json.dumps({"reason": "x\x1b]0;title\x07\x1b[2J" + "y" * 1_000_000,
                                         "backoff": 1e9, "exit_code": 300, "group_rank": -1}))
    assert msg.backoff == 0.0 and msg.exit_code == StopMessage.exit_code and msg.group_rank is None
    assert "\x1b" not in msg.reason and "\\x1b]0;title\\x07" in msg.reason
    assert len(msg.reason) < 2100
    assert StopMessage.decode(json.dumps({"reason": "r" * 7_000_000})).reason.startswith("peer requested stop")
    assert StopMessage.decode(DEEP).reason.startswith("peer requested stop")
    assert StopMessage.decode('{"backoff": NaN}').backoff == 0.0


def test_inquiry_values_that_would_crash_the_next_hang_are_refused(store):
    """Deeply nested JSON in the inquiry keys made both agents exit 4 at the next real hang."""
    rnd = _round(store)
    rnd.control.set("inquiry/0/evidence/1", DEEP)
    inquiry.publish_evidence(rnd, 0, 0, [{"rank": 0}])
    found = inquiry.collect_evidence(rnd, 0, nodes=2, deadline=time.monotonic() + 1)
    assert found == {0: [{"rank": 0}]}  # node 1's value refused: that node counts as silent
    assert inquiry.Opener.decode(0, DEEP).group_rank == 0
    rnd.control.set("inquiry/0/verdict", DEEP)
    assert inquiry.wait_verdict(rnd, 0, deadline=time.monotonic() + 1) is None


def test_a_verdicts_text_is_one_bounded_line():
    v = verdict_from_dict({"culprits": [1], "basis": "stacks", "reason": "\r[mbr-launch vm] HANG: rank 0\n" * 10_000})
    assert v is not None and "\n" not in v.reason and "\r" not in v.reason and len(v.reason) < 2100


def test_a_forged_layout_is_refused_not_expanded(store):
    with pytest.raises(layout.LayoutUnreadable):
        layout.decode_sizes("1x99999999999", 2)
    store.set("mbr/lws/1", "2")
    store.set(layout.KEY, json.dumps({"token": "t", "restarts": 0, "master_port": 1, "sizes": "9x" + "9" * 5000}))
    with pytest.raises(layout.LayoutUnreadable):
        layout.agree(store, 1, 2, 2, lambda: ("t", 0, 1))


# ---- the secret ---------------------------------------------------------------------------------------------

def test_sealed_values_bind_the_key_and_refuse_forgeries():
    sealer = storevalue.Sealer(SECRET)
    sealed = sealer.seal("r1/stop", b'{"reason": "x"}')
    assert sealer.open("r1/stop", sealed) == b'{"reason": "x"}'
    for key, raw in (("r2/stop", sealed), ("r1/stop", b'{"reason": "x"}'),
                     ("r1/stop", sealed.replace(b'"x"', b'"y"')),
                     ("r1/stop", storevalue.Sealer(b"another job's secret!!").seal("r1/stop", b"{}"))):
        with pytest.raises(storevalue.RefusedValue):
            sealer.open(key, raw)


def test_a_forged_stop_is_ignored_and_the_real_one_replaces_it(store):
    """A neighbour's stop written first (compare_set: first writer wins) would block every real one."""
    rnd = _round(store, secret=SECRET)
    rnd.control.set("stop", json.dumps({"reason": "forged", "final": True, "exit_code": 0}))
    assert read_stop(rnd) is None
    assert publish_stop(rnd, StopMessage(reason="rank 3 exited 1"))
    assert read_stop(rnd).reason == "rank 3 exited 1"


def test_torchs_pickled_state_is_verified_before_it_is_unpickled(store, tmp_path):
    """Finding 1: the state that every agent unpickles ran a neighbour's command within 12 s."""
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    backend = rdzvstore.backend(store, "job1", storevalue.Sealer(SECRET))
    state = pickle.dumps({"round": 1})
    stored, token, written = backend.set_state(state)
    assert written and stored == state
    store.set("torch.rendezvous.job1", base64.b64encode(pickle.dumps(Payload())).decode())
    got, forged_token = backend.get_state()
    assert got == state  # the last authentic state, with the forgery's token: torch's next write replaces it
    pickle.loads(got)
    assert not marker.exists() and backend.refused == 1
    again, _, written = backend.set_state(pickle.dumps({"round": 2}), forged_token)
    assert written and pickle.loads(again) == {"round": 2}


@pytest.mark.parametrize("mode, problem", [(0o644, "read or written by others"), (0o600, "at least 16")])
def test_a_secret_file_others_can_read_or_too_short_is_refused(tmp_path, mode, problem):
    path = tmp_path / "secret"
    path.write_bytes(SECRET if mode != 0o600 else b"short")
    path.chmod(mode)
    with pytest.raises(SecretFileError, match=problem):
        read_secret(str(path))
    link = tmp_path / "link"
    link.symlink_to(path)
    with pytest.raises(SecretFileError, match="symbolic link"):
        read_secret(str(link))


def test_a_standalone_store_listens_on_loopback_only():
    port = free_port()
    fd = listen.listening_fd(port, "localhost", loopback=True)
    assert fd is not None
    try:
        with socket.socket(fileno=os.dup(fd)) as sock:
            assert sock.getsockname() == ("127.0.0.1", port)
    finally:
        listen.close_fd(fd)


LISTENING = """\
import os, psutil
agent = psutil.Process(os.getppid())
for proc in [agent, *agent.children(recursive=True)]:
    for c in proc.net_connections(kind="tcp"):
        if c.status == "LISTEN":
            print("listening", c.laddr.ip, flush=True)
"""


@pytest.mark.processes
@pytest.mark.timeout(120)
def test_a_standalone_job_listens_on_loopback_only(tmp_path):
    """torchrun --standalone serves its store on every interface; ours (and the workers' store at localhost) are
    on 127.0.0.1: no other machine has any business with a single-node job's stores."""
    (tmp_path / "l.py").write_text(LISTENING)
    out = subprocess.run([sys.executable, "-m", "mbr_launch", "--standalone", "--nproc-per-node", "1", "--standby",
                          "off", "--status", "off", "--log-dir", str(tmp_path / "logs"), str(tmp_path / "l.py")],
                         capture_output=True, text=True, env=launcher_env(), timeout=100)
    assert out.returncode == 0, out.stderr
    addresses = [line.split()[-1] for line in out.stdout.splitlines() if "listening" in line]
    assert len(addresses) >= 2 and set(addresses) == {"127.0.0.1"}, out.stdout


# ---- the attack, by another user, against two real agents -------------------------------------------------

WORKER = """\
import os, sys, time
from pathlib import Path
d = Path(sys.argv[1])
(d / f"up{os.environ['RANK']}").write_text(str(os.getpid()))
end = time.time() + 60
while not (d / "go").exists() and time.time() < end:
    time.sleep(0.1)
(d / f"done{os.environ['RANK']}").write_text("1")
"""


@pytest.mark.processes
@pytest.mark.timeout(150)
@pytest.mark.skipif(os.geteuid() != 0, reason="becomes uid 65534 to attack as another user")
def test_another_user_can_neither_run_code_nor_steer_a_job_with_a_secret(tmp_path):
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    secret.chmod(0o600)
    (tmp_path / "w.py").write_text(WORKER)
    marker = Path("/tmp") / f"mbr-pwned-{os.getpid()}"
    marker.unlink(missing_ok=True)
    port, run_id = free_port(), f"attack{os.getpid()}"
    cmd = [sys.executable, "-m", "mbr_launch", "--nnodes", "2", "--nproc-per-node", "1", "--standby", "off",
           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", run_id, "--status", "off",
           "--rdzv-secret-file", str(secret), "--log-dir", str(tmp_path / "logs"), str(tmp_path / "w.py"),
           str(tmp_path)]
    agents = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=launcher_env(),
                               start_new_session=True) for _ in range(2)]
    try:
        deadline = time.monotonic() + 90
        while not all((tmp_path / f"up{r}").exists() for r in (0, 1)):
            assert time.monotonic() < deadline and all(a.poll() is None for a in agents), "workers did not start"
            time.sleep(0.2)
        attack = subprocess.run([sys.executable, str(SCRIPTS / "store_attack.py"), "--port", str(port),
                                 "--run-id", run_id, "--marker", str(marker)], capture_output=True, text=True,
                                timeout=60)
        assert attack.returncode == 0, attack.stderr
        assert attack.stdout.startswith("uid 65534") and attack.stdout.count("wrote ") == 4, attack.stdout
        time.sleep(8)  # torch's keep-alives (every 5 s) and our watchers read the forged values meanwhile
        assert all(a.poll() is None for a in agents), "the forged stop or verdict ended an agent"
        (tmp_path / "go").write_text("1")
        outs = [a.communicate(timeout=60) for a in agents]
    finally:
        for a in agents:
            if a.poll() is None:
                os.killpg(a.pid, 9)
                a.communicate()
        marker_there = marker.exists()
        marker.unlink(missing_ok=True)
    assert [a.returncode for a in agents] == [0, 0], outs
    assert all((tmp_path / f"done{r}").exists() for r in (0, 1))
    assert not marker_there, "torch's state was unpickled unverified: the neighbour's command ran"
    err = "".join(e for _, e in outs)
    assert "refused the rendezvous store's value" in err and "\x1b]0;pwned" not in err
    assert not [p for p in psutil.process_iter(["cmdline"]) if str(tmp_path / "w.py") in " ".join(p.info["cmdline"] or [])]


def test_a_neighbours_add_cannot_spend_the_restart_budget(store):
    """With a secret the counters that steer the job are sealed: ``add("restarts", 1000)`` by anyone else (or a
    forged value) leaves the count where the agents put it."""
    job = JobStore(PrefixStore("mbr/job/j", store), "mbr/job/j", storevalue.Sealer(SECRET))
    assert job.add("restarts", 1) == 1
    neighbour = PrefixStore("mbr/job/j", TCPStore("127.0.0.1", store.port, is_master=False,
                                                   timeout=datetime.timedelta(seconds=5)))
    with pytest.raises(Exception):
        neighbour.add("restarts", 1000)  # torch's add of a sealed value: not a number, the store drops that client
    neighbour = PrefixStore("mbr/job/j", TCPStore("127.0.0.1", store.port, is_master=False,
                                                   timeout=datetime.timedelta(seconds=5)))
    neighbour.set("restarts", "999")
    assert job.add("restarts", 0) == 1
    assert job.add("restarts", 1) == 2
