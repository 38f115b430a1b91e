"""Wire format: real NVRx 0.4.1 messages decode; our hand-written replies load as real NVRx objects;
anything outside the allow-list is refused without running."""

from __future__ import annotations

import logging
import os
import pickle
import signal
import subprocess
import sys
import uuid
from multiprocessing.reduction import ForkingPickler

import pytest

from mbr_launch.monitor import protocol, replies
from mbr_launch.monitor.protocol import (
    Authkey,
    Decoder,
    Heartbeat,
    Init,
    Invalid,
    ProtocolError,
    SectionClose,
    SectionCloseAll,
    SectionOpen,
    UpdateConfig,
    decode_workload_request,
    frame_length,
)

pytestmark = pytest.mark.timeout(60)

data = pytest.importorskip("nvidia_resiliency_ext.fault_tolerance.data")
from nvidia_resiliency_ext.fault_tolerance.config import FaultToleranceConfig  # noqa: E402


def dumps(obj) -> bytes:
    return bytes(ForkingPickler.dumps(obj))


def test_client_messages_decode():
    init = data.InitMsg()
    init.rank_info = data.RankInfo(global_rank="3", local_rank=1, host="node7", pid=4242)
    d = Decoder()
    assert d.decode(dumps(data.AuthkeyMsg())) == Authkey()
    assert d.decode(dumps(init)) == Init(rank=3, local_rank=1, host="node7", pid=4242)
    assert d.decode(dumps(data.HeartbeatMsg("3", {}))) == Heartbeat()
    assert d.decode(dumps(data.SectionMsg(3, "step", data.SectionAction.OPEN))) == SectionOpen("step")
    assert d.decode(dumps(data.SectionMsg(3, "step", data.SectionAction.CLOSE))) == SectionClose("step")
    assert d.decode(dumps(data.SectionMsg(3, None, data.SectionAction.CLOSE_ALL))) == SectionCloseAll()
    assert isinstance(d.decode(dumps(data.HeartbeatMsg(3, {"x": 1}))), Invalid)


def test_update_config_decodes_with_sets_and_nones():
    msg = data.UpdateConfigMsg(
        data.HeartbeatTimeouts(initial=12.5, subsequent=3.0, were_calculated=True),
        data.SectionTimeouts(section={"step": 2.0, "ckpt": None}, out_of_section=None,
                             calculated_sections=["step"], is_out_of_section_calculated=False),
    )
    req = Decoder().decode(dumps(msg))
    assert isinstance(req, UpdateConfig)
    assert req.hb is not None and (req.hb.initial, req.hb.subsequent, req.hb.were_calculated) == (12.5, 3.0, True)
    assert req.section is not None and req.section.section == {"step": 2.0, "ckpt": None}
    assert req.section.calculated_sections == ("step",) and req.section.out_of_section is None
    only_hb = Decoder().decode(dumps(data.UpdateConfigMsg(data.HeartbeatTimeouts(1.0, 2.0, True), None)))
    assert isinstance(only_hb, UpdateConfig) and only_hb.section is None


def test_bad_timeout_value_is_a_bad_request_not_a_crash():
    msg = data.UpdateConfigMsg(data.HeartbeatTimeouts(initial="soon", subsequent=1.0), None)
    assert isinstance(Decoder().decode(dumps(msg)), Invalid)


def test_decoder_memoizes_identical_payloads():
    d = Decoder()
    payload = dumps(data.HeartbeatMsg("0", {}))
    assert d.decode(payload) is d.decode(bytes(payload))


def test_workload_request_decodes():
    req = decode_workload_request(dumps((5, data.WorkloadControlRequest(data.WorkloadAction.ExcludeThisNode, "bad GPU"))))
    assert (req.rank, req.action, req.description) == (5, "ExcludeThisNode", "bad GPU")


def test_ok_reply_loads_as_real_okmsg():
    obj = pickle.loads(replies.OK_FRAME[4:])
    assert type(obj) is data.OkMsg and vars(obj) == {}
    assert int.from_bytes(replies.OK_FRAME[:4], "big") == len(replies.OK_FRAME) - 4


def test_init_reply_carries_a_real_fault_tolerance_config():
    cfg = {
        "initial_rank_heartbeat_timeout": 12.0, "rank_heartbeat_timeout": None,
        "rank_section_timeouts": {"step": 3.5, "ckpt": None}, "rank_out_of_section_timeout": 7.0,
        "workload_check_interval": 0.5, "safety_factor": 2.5, "rank_termination_signal": "SIGTERM",
        "log_level": logging.DEBUG, "restart_check_interval": 1.0, "enable_nic_monitor": False,
        "node_health_check_interval": 9.0, "unknown_key": "dropped",
    }
    obj = pickle.loads(replies.ok_msg(cfg=replies.ft_config(cfg)))
    assert type(obj) is data.OkMsg
    got = obj.cfg
    assert type(got) is FaultToleranceConfig
    expected = FaultToleranceConfig(**{k: v for k, v in cfg.items() if k != "unknown_key"})
    assert got == expected
    assert got.rank_termination_signal is signal.SIGTERM
    assert got.rank_section_timeouts == {"step": 3.5, "ckpt": None}


def test_error_reply_loads_as_real_errormsg():
    obj = pickle.loads(replies.error_msg("Section 'x' is not open. ünï"))
    assert type(obj) is data.ErrorMsg and obj.cause == "Section 'x' is not open. ünï"
    assert pickle.loads(replies.WORKLOAD_OK_FRAME[4:]) == b"ok"


def test_reply_encoder_primitives_roundtrip():
    values = [None, True, False, 0, 255, 256, -1, 2**31, -(2**40), 1.5, "", "x" * 300, b"ab", {"a": [1, 2.0]}, []]
    for v in values:
        assert pickle.loads(replies.dumps(v)) == v


class _Evil:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def test_malicious_pickle_is_refused_without_running(tmp_path):
    marker = tmp_path / f"pwned-{uuid.uuid4().hex}"
    payload = pickle.dumps(_Evil(str(marker)))
    assert b"system" in payload
    with pytest.raises(ProtocolError, match="refused"):
        Decoder().decode(payload)
    assert not marker.exists()


@pytest.mark.parametrize(
    "payload",
    [
        pickle.dumps(subprocess.Popen),
        pickle.dumps({"a": 1}),  # a valid pickle but not a message
        pickle.dumps(sys.modules.__class__),
        b"\x80\x04\x95garbage",
        b"",
        b"cos\nsystem\n(S'true'\ntR.",  # protocol 0 GLOBAL + REDUCE
    ],
)
def test_other_payloads_are_protocol_errors(payload):
    with pytest.raises(ProtocolError):
        Decoder().decode(payload)


def test_frame_length_limits():
    assert frame_length((100).to_bytes(4, "big")) == 100
    for bad in (0, protocol.MAX_FRAME + 1, 2**32 - 1):
        with pytest.raises(ProtocolError):
            frame_length(bad.to_bytes(4, "big"))


# ---- frames read into inert values (issue 16) -----------------------------------------------------------------

_DATA = "nvidia_resiliency_ext.fault_tolerance.data"


def _op_str(text: str) -> bytes:
    raw = text.encode()
    return b"\x8c" + bytes([len(raw)]) + raw


class _Renamed:
    def __reduce__(self):
        return (data.WorkloadAction, (1,), {"_name_": "Continue", "_value_": 0})


def test_build_cannot_rename_an_enum_member():
    rename = dumps((1, data.WorkloadControlRequest(_Renamed(), "x")))
    with pytest.raises(ProtocolError, match="WorkloadAction: unexpected pickled form"):
        decode_workload_request(rename)
    genuine = decode_workload_request(dumps((1, data.WorkloadControlRequest(data.WorkloadAction.ExcludeThisNode, "y"))))
    assert genuine.action == "ExcludeThisNode"
    assert protocol.WorkloadAction(1).name == "ExcludeThisNode" and data.WorkloadAction(1).name == "ExcludeThisNode"


@pytest.mark.parametrize("enum_name", ["SectionAction", "WorkloadAction"])
def test_build_cannot_empty_an_enum_class(enum_name):
    # BUILD on the class itself, with slot state: setattr(cls, '_member_map_', {}) under pickle.loads
    attack = (b"\x80\x04" + _op_str(_DATA) + _op_str(enum_name) + b"\x93N}(" + _op_str("_value2member_map_") + b"}"
              + _op_str("_member_map_") + b"}u\x86b.")
    with pytest.raises(ProtocolError, match="BUILD"):
        Decoder().decode(attack)
    assert Decoder().decode(dumps(data.SectionMsg(3, "step", data.SectionAction.OPEN))) == SectionOpen("step")
    assert len(protocol.SectionAction.__members__) == 3 and len(protocol.WorkloadAction.__members__) == 3


def test_deep_nesting_and_too_many_opcodes_are_refused():
    deep = b"\x80\x04" + b"]" * 100 + b"a" * 99 + b"."  # a list nested 100 deep, built without recursion
    with pytest.raises(ProtocolError, match="nested deeper"):
        protocol.unpickle(deep)
    cyclic = b"\x80\x04]\x94h\x00a."  # a list appended to itself through the memo
    with pytest.raises(ProtocolError, match="nested deeper|more than"):
        protocol.unpickle(cyclic)
    flood = b"\x80\x04]" + b"Na" * 30_000 + b"."
    with pytest.raises(ProtocolError, match="opcodes"):
        protocol.unpickle(flood)


@pytest.mark.parametrize("initial", [10**400, 1e300, float("inf"), float("nan"), -1.0, protocol.MAX_TIMEOUT * 2])
def test_out_of_range_timeouts_are_refused_not_crashing(initial):
    req = Decoder().decode(dumps(data.UpdateConfigMsg(data.HeartbeatTimeouts(initial=initial, subsequent=1.0), None)))
    assert isinstance(req, Invalid) and "initial: timeout" in req.cause


@pytest.mark.parametrize("rank", [None, "zero", 1.5, True, -1, 2**40, [1]])
def test_ranks_must_be_integers(rank):
    with pytest.raises(protocol.BadRequest, match="rank"):
        decode_workload_request(dumps((rank, data.WorkloadControlRequest(data.WorkloadAction.ShutdownWorkload, "x"))))
    init = data.InitMsg()
    init.rank_info = data.RankInfo(global_rank=rank, local_rank=0, host="h", pid=7)
    assert isinstance(Decoder().decode(dumps(init)), Invalid)
    assert isinstance(Decoder().decode(dumps(data.HeartbeatMsg(rank, {}))), Invalid)


def test_long_section_names_and_hosts_are_refused():
    assert isinstance(Decoder().decode(dumps(data.SectionMsg(0, "s" * 300, data.SectionAction.OPEN))), Invalid)
    init = data.InitMsg()
    init.rank_info = data.RankInfo(global_rank=0, local_rank=0, host="h" * 5000, pid=7)
    assert isinstance(Decoder().decode(dumps(init)), Invalid)


def test_protocol_2_sets_and_text_globals_still_decode():
    msg = data.UpdateConfigMsg(None, data.SectionTimeouts(section={"step": 2.0}, calculated_sections={"step"}))
    for proto in (2, 3):
        req = Decoder().decode(pickle.dumps(msg, protocol=proto))
        assert isinstance(req, UpdateConfig) and req.section is not None
        assert req.section.calculated_sections == ("step",)
