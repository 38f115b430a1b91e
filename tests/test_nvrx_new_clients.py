"""The real monitor process against the real NVRx 0.6.0 / 0.7.0 ``RankMonitorClient`` (and 0.4.1 beside it where
the two generations differ): fire-and-forget heartbeats and sections, each version's config and defaults, the
out-of-section rule before the first "step", the "warmup" section, the iteration a client reports, calculated
timeouts.

0.6.0 and 0.7.0 ship byte-identical client modules (data.py, rank_monitor_client.py, ...), so these run the 0.6.0
client, which Megatron-Bridge pins; the 0.7.0 client runs NVRx 0.7's own examples (test_nvrx_examples.py). The
out-of-section rule with a "warmup" section, and the others with every edge, are unit tests of the deadlines
(test_monitor_deadlines.py).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from .test_monitor_server import Mon, assert_one_expiry, make_mon  # noqa: F401 (make_mon is a fixture)

pytestmark = [pytest.mark.timeout(120), pytest.mark.processes]

# The generation tag the monitor reports for a 0.6 / 0.7 client (events "connected" and "status").
NEWER = "0.6+"

CLIENT = textwrap.dedent(
    """
    import json, os, sys, time, types

    def out(**kw):
        print(json.dumps(kw), flush=True)

    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "warmup":
        # What Megatron-LM looks like to the client: its global_vars module, whose _GLOBAL_ARGS carries the
        # current iteration (the client reports it in every "step" message and at init).
        megatron_args = types.SimpleNamespace(curr_iteration=100)
        sys.modules["megatron"] = types.ModuleType("megatron")
        sys.modules["megatron.training"] = types.ModuleType("megatron.training")
        gv = sys.modules["megatron.training.global_vars"] = types.ModuleType("megatron.training.global_vars")
        gv._GLOBAL_ARGS = megatron_args
    from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

    if mode == "raw_double_open":
        # The client checks sections itself before it sends them, so a section error reaches the monitor only
        # from a peer that speaks the protocol by hand: the client's own messages and framing, no checks.
        import socket
        from nvidia_resiliency_ext.fault_tolerance import data, utils
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(os.environ["FT_RANK_MONITOR_IPC_SOCKET"])
        utils.write_object_to_ipc_socket(data.AuthkeyMsg(), s)
        utils.read_obj_from_ipc_socket(s)
        utils.write_object_to_ipc_socket(data.InitMsg(data.RankInfo.get_for_current_rank()), s)
        skip = utils.read_obj_from_ipc_socket(s).cfg.skip_section_response
        for _ in range(2):
            utils.write_object_to_ipc_socket(data.SectionMsg(0, "step", data.SectionAction.OPEN), s)
        for _ in range(300):
            utils.write_object_to_ipc_socket(data.HeartbeatMsg(0), s)
        s.settimeout(1.0)
        try:
            extra = len(s.recv(1 << 16))
        except socket.timeout:
            extra = 0
        out(ev="done", skip=skip, unread_reply_bytes=extra)
        s.close()
        sys.exit(0)

    c = RankMonitorClient()
    c.init_workload_monitoring(**({"num_warmup_iters": 3} if mode == "warmup" else {}))
    cfg = c.cfg
    out(ev="init", skip=getattr(cfg, "skip_section_response", "absent"), initial=cfg.initial_rank_heartbeat_timeout,
        subsequent=cfg.rank_heartbeat_timeout, sections=dict(cfg.rank_section_timeouts),
        hook=getattr(cfg, "install_exception_hook", "absent"), warmup=getattr(cfg, "num_warmup_iterations", "absent"),
        cycles=getattr(cfg, "max_no_progress_cycles", "absent"))

    def hang():
        out(ev="hanging")
        time.sleep(600)

    if mode == "loop":  # N iterations of: heartbeat, open "step", close "step"
        n = int(args[0])
        t = time.monotonic()
        for _ in range(n):
            c.send_heartbeat()
            c.start_section("step")
            c.end_section("step")
        out(ev="done", n=n, seconds=time.monotonic() - t)
        c.shutdown_workload_monitoring()
    elif mode == "replies":  # skip_section_response off: every heartbeat and section waits for the reply
        for _ in range(300):
            c.send_heartbeat()
            c.start_section("step")
            c.end_section("step")
        out(ev="done")
        c.shutdown_workload_monitoring()
    elif mode == "slow_start":  # start-up outside any section longer than the out-of-section timeout
        time.sleep(float(args[0]))
        out(ev="started")
        for _ in range(3):
            c.start_section("step")
            c.end_section("step")
        hang()  # now outside any section after a "step": the out-of-section timeout runs
    elif mode == "warmup":  # 3 slow steps (warm-up), then a hang in "step" past its own timeout
        for i in range(4):
            megatron_args.curr_iteration = 100 + i
            c.start_section("step")
            if i == 3:
                hang()
            time.sleep(float(args[0]))
            c.end_section("step")
    elif mode == "calc":
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args[0]}", rank=0, world_size=1)
        for _ in range(3):
            c.start_section("step")
            time.sleep(0.1)
            c.end_section("step")
        c.calculate_and_set_section_timeouts(calc_out_of_section=False)  # waits for the monitor's reply
        out(ev="calculated", section=dict(c.section_timeouts.section))
        c.start_section("step")
        hang()
    """
)


@pytest.fixture
def client(tmp_path: Path) -> Path:
    path = tmp_path / "client.py"
    path.write_text(CLIENT)
    return path


def _errors(mon: Mon) -> list[dict]:
    return [e for e in mon.events.drain(0.3) if e.get("ev") in ("error", "expired")]


def test_thousands_of_fire_and_forget_iterations(make_mon, client):
    # The 0.6+ client writes heartbeats and sections without reading a reply: a monitor that still wrote one
    # filled the socket buffer after ~135 iterations and both sides blocked (taken for a hang).
    mon = make_mon(user_set=["rank_section_timeouts", "rank_out_of_section_timeout"],
                   rank_section_timeouts={"step": 30.0}, rank_out_of_section_timeout=30.0)
    mon.arm(0, rank=0)
    proc, out = mon.spawn("loop", "5000", nvrx="0.6.0", script=client)
    init = out.wait("init")
    # The client's own version's config: skip_section_response on, heartbeat timeouts off (not 0.4.1's
    # 3600/2700, which the user did not ask for), and every 0.6+ field it reads.
    assert init["skip"] is True and init["initial"] is None and init["subsequent"] is None
    assert init["sections"] == {"step": 30.0} and init["hook"] is False and init["warmup"] == 5
    connected = mon.events.wait("connected", local_rank=0)
    assert connected["nvrx"] == NEWER and connected["replies"] is False
    assert out.wait("done", timeout=90)["n"] == 5000
    assert proc.wait(30) == 0
    assert _errors(mon) == []


def test_user_values_reach_a_newer_client(make_mon, client):
    mon = make_mon(user_set=["rank_heartbeat_timeout", "skip_section_response", "install_exception_hook",
                             "num_warmup_iterations", "rank_section_timeouts"],
                   rank_heartbeat_timeout=50.0, skip_section_response=False, install_exception_hook=True,
                   num_warmup_iterations=7, rank_section_timeouts={"step": 30.0})
    mon.arm(0)
    proc, out = mon.spawn("replies", nvrx="0.6.0", script=client)
    init = out.wait("init")
    assert init["skip"] is False and init["subsequent"] == 50.0 and init["initial"] is None
    assert init["hook"] is True and init["warmup"] == 7
    assert mon.events.wait("connected", local_rank=0)["replies"] is True
    out.wait("done")
    assert proc.wait(30) == 0


def test_a_section_error_without_replies_is_an_event_not_a_reply(make_mon, client):
    mon = make_mon(user_set=["rank_section_timeouts"], rank_section_timeouts={"step": 30.0})
    mon.arm(0)
    proc, out = mon.spawn("raw_double_open", nvrx="0.6.0", script=client)
    done = out.wait("done", timeout=60)
    # 300 heartbeats and a refused open later: not one byte was written back, nothing blocked.
    assert done == {"ev": "done", "skip": True, "unread_reply_bytes": 0}
    err = mon.events.wait("error", local_rank=0)
    assert "already open" in err["message"] and err["pid"] == proc.pid
    assert proc.wait(30) == 0


@pytest.mark.parametrize(("version", "expires"), [("0.6.0", False), ("0.4.1", True)])
def test_out_of_section_time_before_the_first_step(make_mon, client, version, expires):
    # NVRx 0.6+ does not time start-up outside any section before the first "step" (PR #299); 0.4.1 does.
    mon = make_mon(user_set=["rank_section_timeouts", "rank_out_of_section_timeout"],
                   rank_section_timeouts={"step": 30.0}, rank_out_of_section_timeout=0.8)
    mon.arm(0)
    _, out = mon.spawn("slow_start", "2.0", nvrx=version, script=client)
    init = out.wait("init")
    if expires:
        # A 0.4.1 client keeps 0.4.1's config: its defaults for what the user did not set.
        assert init["skip"] == "absent" and (init["initial"], init["subsequent"]) == (3600.0, 2700.0)
        assert mon.events.wait("connected", local_rank=0)["nvrx"] == "0.4.1"
        ev = assert_one_expiry(mon, 0, kind="out_of_section")
        assert ev["open_sections"] == []
        return
    out.wait("started")
    out.wait("hanging")
    ev = assert_one_expiry(mon, 0, kind="out_of_section")  # after "step" was seen, it is timed again
    assert ev["timeout"] == 0.8


def test_warmup_section_times_the_first_steps_and_the_iteration_is_recorded(make_mon, client):
    # "warmup" (3 s) times "step" for the client's first 3 iterations (num_warmup_iters=3 in its init); each of
    # those takes 1 s, past step's own 0.6 s; the 4th step hangs and is timed by "step".
    mon = make_mon(user_set=["rank_section_timeouts"], rank_section_timeouts={"step": 0.6, "warmup": 3.0})
    mon.arm(0)
    _, out = mon.spawn("warmup", "1.0", nvrx="0.6.0", script=client)
    # The iteration the client reports (Megatron's) is recorded: at init, in the status rows, in the verdict.
    assert mon.events.wait("connected", local_rank=0)["iteration"] == 100
    out.wait("hanging", timeout=60)
    # The expiry first: its messages are fire-and-forget, so only the 4th step's expiry proves the monitor has
    # read them (a snapshot asked for on the control channel can overtake the client's last open).
    ev = assert_one_expiry(mon, 0, kind="section")
    assert ev["section"] == "step" and ev["timeout"] == 0.6 and ev["iteration"] == 103
    mon.send(op="snapshot")
    row = mon.events.wait("snapshot")["ranks"][0]
    assert row["iteration"] == 103 and row["nvrx"] == NEWER


def test_calculated_timeouts_of_a_newer_client(make_mon, client, port):
    mon = make_mon(user_set=["rank_section_timeouts", "safety_factor"], rank_section_timeouts={"step": 60.0},
                   safety_factor=4.0)
    mon.arm(0)
    _, out = mon.spawn("calc", str(port), nvrx="0.6.0", script=client)
    new = out.wait("calculated", timeout=90)["section"]["step"]
    assert 0.35 < new < 3.0  # 4 x ~0.1 s
    assert mon.events.wait("timeouts_updated", local_rank=0)["section"]["section"]["step"] == pytest.approx(new)
    ev = assert_one_expiry(mon, 0, kind="section")
    assert ev["timeout"] == pytest.approx(new)
