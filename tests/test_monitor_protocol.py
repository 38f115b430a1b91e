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
