"""The pre-rendezvous checks (``mbr_launch.health``): each rule as a pure function over what was read, the
suite in NVRx's order with fake readers, the storage probe on real files, and the node-health daemon's gRPC
call against a real server on a unix socket (its messages also checked against NVRx 0.7's generated code)."""

from __future__ import annotations

import importlib.util
import json
import os
from concurrent import futures
from dataclasses import replace

import pytest

from mbr_launch.config.model import NvrxLauncherSpec
from mbr_launch.health import checks, suite
from mbr_launch.health.checks import PathStatus, ProbeReport, Reply, SegmentArtifact

from testkit import nvhcd
from testkit.nvrx_versions import nvrx_dir

pytestmark = pytest.mark.timeout(60)


# ---- storage paths -----------------------------------------------------------------------------------------

def test_storage_paths_pass_only_when_every_path_was_probed_ok():
    ok = ProbeReport((PathStatus("/a", "ok"), PathStatus("/b", "ok")))
    assert checks.storage_paths(["/a", "/b"], ok).ok
    bad = ProbeReport((PathStatus("/a", "missing"), PathStatus("/b", "unreadable", "Permission denied")))
    result = checks.storage_paths(["/a", "/b"], bad)
    assert not result.ok and result.detail == "/a is missing; /b is unreadable (Permission denied)"
    hung = ProbeReport((PathStatus("/a", "ok"), PathStatus("/b", "hung", "no answer within 10 s")))
    assert checks.storage_paths(["/a", "/b", "/c"], hung).detail == \
        "/b did not answer (no answer within 10 s); /c was not probed"
    assert not checks.storage_paths(["/a"], ProbeReport((), error="cannot start the probe")).ok
    assert checks.storage_paths(["", ""], ProbeReport(())).skipped


@pytest.mark.processes
def test_the_probe_reads_real_paths_in_a_process_of_its_own(tmp_path):
    (tmp_path / "file").write_bytes(b"x" * 10)
    (tmp_path / "dir").mkdir()
    locked = tmp_path / "locked"
    locked.mkdir(mode=0)
    paths = [str(tmp_path / "file"), str(tmp_path / "dir"), str(tmp_path / "gone"), "relative/path", str(locked)]
    report = suite.probe_paths("read", paths)
    status = {s.path: s.status for s in report.statuses}
    expected_locked = "ok" if os.geteuid() == 0 else "unreadable"  # root reads a mode-0 folder
    assert status == {paths[0]: "ok", paths[1]: "ok", paths[2]: "missing", paths[3]: "invalid",
                      paths[4]: expected_locked}
    assert {s.path: s.status for s in suite.probe_paths("list", paths[:2]).statuses} == \
        {paths[0]: "not a directory", paths[1]: "ok"}
    locked.chmod(0o700)


@pytest.mark.processes
def test_a_probe_that_does_not_answer_names_the_path_it_hung_on(tmp_path, monkeypatch):
    # A probe that answers for the first path, then blocks, as a stat on a dead NFS mount does.
    stuck = tmp_path / "stuck_probe.py"
    stuck.write_text("import json, sys, time\n"
                     "print(json.dumps({'path': sys.argv[2], 'status': 'ok', 'detail': ''}), flush=True)\n"
                     "time.sleep(60)\n")
    monkeypatch.setattr(suite, "PROBE", str(stuck))
    report = suite.probe_paths("read", ["/a", "/b", "/c"], timeout=1.0)
    assert [(s.path, s.status) for s in report.statuses] == [("/a", "ok"), ("/b", "hung")]
    assert checks.storage_paths(["/a", "/b", "/c"], report).detail == \
        "/b did not answer (no answer within 1 s); /c was not probed"


# ---- network file systems ----------------------------------------------------------------------------------

MOUNTINFO = """\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
40 22 0:40 / /mnt/lustre rw shared:20 - lustre 10.0.0.1@o2ib:/fs rw
41 22 0:41 / /home/with\\040space rw master:3 - nfs4 srv:/home rw
42 22 0:42 / /scratch rw - nfs srv:/scratch rw
43 22 0:42 / /scratch rw - nfs srv:/scratch rw
44 22 0:43 / /proc/fs rw - proc proc rw
"""


def test_network_mounts_from_mountinfo():
    assert checks.network_mounts(MOUNTINFO) == ["/mnt/lustre", "/home/with space", "/scratch"]
    assert checks.network_mounts("garbage\n\n1 2 3") == []


def test_dist_storage_lustre_first_then_mounts():
    ok = ProbeReport((PathStatus("/l", "ok"),))
    assert checks.dist_storage("healthy\n", None, ["/l"], ok).ok
    assert not checks.dist_storage("NOT HEALTHY", None, ["/l"], ok).ok
    assert not checks.dist_storage(None, "Permission denied", [], None).ok
    assert checks.dist_storage(None, None, [], None).skipped  # no Lustre, no network mounts
    down = checks.dist_storage(None, None, ["/l"], ProbeReport((PathStatus("/l", "hung", "no answer within 15 s"),)))
    assert not down.ok and "/l did not answer" in down.detail


# ---- NIC links ---------------------------------------------------------------------------------------------

def test_a_port_active_at_start_that_is_down_now_fails():
    assert checks.link_state("4: ACTIVE\n") == "ACTIVE" and checks.link_state("DOWN") == "DOWN"
    baseline = {"mlx5_0": "ACTIVE", "mlx5_1": "ACTIVE", "mlx5_2": "DOWN"}
    assert checks.nic_links(baseline, {"mlx5_0": "ACTIVE", "mlx5_1": "ACTIVE", "mlx5_2": "DOWN"}).ok
    failed = checks.nic_links(baseline, {"mlx5_0": "ACTIVE", "mlx5_1": "INIT", "mlx5_2": "DOWN"})
    assert not failed.ok and failed.detail == "NIC link(s) down: mlx5_1 is INIT (was ACTIVE)"
    # down from the start: an unused port, no failure; a device whose state file went away: skipped (NVRx)
    assert checks.nic_links(baseline, {"mlx5_0": "ACTIVE", "mlx5_1": None, "mlx5_2": "DOWN"}).ok
    assert checks.nic_links({}, {}).skipped  # no InfiniBand here


def test_link_states_read_through_the_template(tmp_path):
    devices = tmp_path / "infiniband"
    for nic, state in (("mlx5_0", "4: ACTIVE"), ("mlx5_1", "1: DOWN")):
        (devices / nic / "ports" / "1").mkdir(parents=True)
        (devices / nic / "ports" / "1" / "state").write_text(state + "\n")
    (devices / "mlx5_9").mkdir()  # no state file
    template = str(devices / "{nic}" / "ports" / "1" / "state")
    assert suite.link_states(template, devices=str(devices)) == {"mlx5_0": "ACTIVE", "mlx5_1": "DOWN", "mlx5_9": None}
    assert suite.link_states(template, devices=str(tmp_path / "none")) == {}


# ---- segment decision --------------------------------------------------------------------------------------

def test_segment_path_names_the_array_task():
    env = {"SLURM_JOB_ID": "101", "SLURM_ARRAY_JOB_ID": "100", "SLURM_ARRAY_TASK_ID": "7"}
    assert checks.segment_path("/shared/", env) == "/shared/segment_health_check.100.7"
    assert checks.segment_path("/shared", {"SLURM_JOB_ID": "55"}) == "/shared/segment_health_check.55.55"
    assert checks.segment_path("/shared", {}) is None and checks.segment_path(None, env) is None


def test_only_a_non_empty_regular_decision_file_excludes(tmp_path):
    path = tmp_path / "segment_health_check.1.1"
    assert checks.segment(suite.segment_artifact(str(path))).ok  # none yet
    path.write_text("")
    assert checks.segment(suite.segment_artifact(str(path))).ok
    path.write_text("rack r12 drained by the scheduler\n")
    result = checks.segment(suite.segment_artifact(str(path)))
    assert not result.ok and "rack r12 drained" in result.detail and str(path) in result.detail
    path.unlink()
    path.mkdir()
    assert checks.segment(suite.segment_artifact(str(path))).ok  # not a regular file: ignored (fails open)
    assert checks.segment(None).skipped


# ---- node-health daemon ------------------------------------------------------------------------------------

def test_node_health_reply_rules():
    assert checks.node_health(Reply(True, 0, json.dumps({"fail_count": 0}))).ok
    failed = checks.node_health(Reply(True, 0, json.dumps({"fail_count": 2, "failed_checks": ["gpu", "ib"]})))
    assert not failed.ok and failed.detail == "the node-health daemon counts 2 failed check(s): gpu, ib"
    script = checks.node_health(Reply(False, 3, "", "script crashed"))
    assert not script.ok and "exit code 3" in script.detail and "script crashed" in script.detail
    for output in ("not json", "[1]", json.dumps({"fail_count": True}), json.dumps({"other": 1})):
        assert checks.node_health(Reply(True, 0, output)).ok  # NVRx ignores what it cannot read


def test_endpoints_and_the_message_codec():
    assert suite.socket_path("unix:///run/nvhcd.sock") == "/run/nvhcd.sock"
    assert suite.socket_path("/run/nvhcd.sock") == "/run/nvhcd.sock"
    assert suite.socket_path("./nvhcd.sock") == "./nvhcd.sock"
    assert suite.socket_path("localhost:50051") is None
    reply = Reply(True, -3, '{"fail_count": 1} é', "e")
    assert suite.decode_reply(nvhcd.encode_reply(reply)) == reply
    assert nvhcd.decode_request(suite.encode_request(suite.DEFAULT_ARGS)) == list(suite.DEFAULT_ARGS)
    with pytest.raises(ValueError):
        suite.decode_reply(b"\x1a\x05ab")  # truncated


def _nvhcd_pb2():
    pytest.importorskip("google.protobuf")
    spec = importlib.util.spec_from_file_location(
        "nvhcd_pb2_07", nvrx_dir("0.7.0") / "nvidia_resiliency_ext" / "shared_utils" / "proto" / "nvhcd_pb2.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_codec_speaks_nvrx_07s_messages():
    pb2 = _nvhcd_pb2()
    theirs = pb2.HealthCheckResponse(success=True, exit_code=-3, output='{"fail_count": 1}', error="x")
    assert suite.decode_reply(theirs.SerializeToString()) == Reply(True, -3, '{"fail_count": 1}', "x")
    request = pb2.HealthCheckRequest.FromString(suite.encode_request(["--group", "gpu"]))
    assert list(request.args) == ["--group", "gpu"]


def test_a_real_grpc_daemon_on_a_unix_socket(tmp_path):
    grpc = pytest.importorskip("grpc")
    path = str(tmp_path / "nvhcd.sock")
    seen: list[list[str]] = []
    answers = [Reply(True, 0, json.dumps({"fail_count": 0})), Reply(True, 1, json.dumps({"fail_count": 1, "failed_checks": ["ib"]}))]

    def run(request, context):
        seen.append(request)
        return answers[len(seen) - 1]

    handler = grpc.method_handlers_generic_handler("nvhcd.HealthCheckService", {
        "RunHealthCheck": grpc.unary_unary_rpc_method_handler(
            run, request_deserializer=nvhcd.decode_request, response_serializer=nvhcd.encode_reply)})
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"unix:{path}")
    server.start()
    try:
        assert checks.node_health(suite.query(path, timeout=10)).ok
        second = checks.node_health(suite.query(path, timeout=10))
        assert not second.ok and "ib" in second.detail
        assert seen == [list(suite.DEFAULT_ARGS)] * 2
    finally:
        server.stop(0).wait(5)
    # the daemon gone: skipped with the reason, never a failure
    assert isinstance(suite.query(path, timeout=2), str)
    assert "does not exist" in suite.query(str(tmp_path / "none.sock"))


# ---- the suite ---------------------------------------------------------------------------------------------

class FakeReads:
    def __init__(self, **kw):
        self.calls: list[str] = []
        self.kw = kw

    def readers(self) -> suite.Readers:
        def note(name, value):
            def read(*args):
                self.calls.append(name)
                return value(*args) if callable(value) else value
            return read
        kw = self.kw
        return suite.Readers(
            probe_paths=note("probe", kw.get("probe", lambda mode, paths: ProbeReport(tuple(PathStatus(p, "ok") for p in paths)))),
            link_states=note("links", kw.get("links", {})),
            lustre_health=note("lustre", kw.get("lustre", (None, None))),
            mountinfo=note("mounts", kw.get("mounts", "")),
            segment_artifact=note("segment", kw.get("segment", lambda p: SegmentArtifact(p, "missing"))),
            node_health=note("node", kw.get("node", Reply(True, 0, "{}"))))


EVERYTHING = NvrxLauncherSpec(enable_nic_healthcheck=True, enable_dist_storage_healthcheck=True,
                              storage_healthcheck_paths=("/data",), node_health_check_endpoint="/run/nvhcd.sock",
                              segment_health_check_dir="/shared")


def test_the_suite_runs_in_nvrx_order_and_stops_at_the_first_failure():
    fake = FakeReads(links={"mlx5_0": "ACTIVE"})
    baseline = suite.nic_baseline(EVERYTHING, fake.readers())
    assert baseline == {"mlx5_0": "ACTIVE"}
    fake.calls.clear()
    results = suite.run_checks(EVERYTHING, {"SLURM_JOB_ID": "9"}, baseline, fake.readers())
    assert [r.name for r in results] == ["segment", "nic_links", "dist_storage", "storage_paths", "node_health"]
    assert all(r.ok for r in results) and fake.calls == ["segment", "links", "lustre", "mounts", "probe", "node"]

    failing = FakeReads(links={"mlx5_0": "DOWN"})
    results = suite.run_checks(EVERYTHING, {}, baseline, failing.readers())
    assert [(r.name, r.ok) for r in results] == [("segment", True), ("nic_links", False)]
    assert "probe" not in failing.calls and "node" not in failing.calls


def test_nothing_asked_nothing_read():
    fake = FakeReads()
    assert not suite.configured(NvrxLauncherSpec())
    assert suite.run_checks(NvrxLauncherSpec(), {}, {}, fake.readers()) == [] and fake.calls == []


def test_a_node_health_endpoint_that_is_not_a_socket_or_not_there_is_skipped():
    spec = replace(NvrxLauncherSpec(), node_health_check_endpoint="localhost:50051")
    [result] = suite.run_checks(spec, {}, {}, FakeReads().readers())
    assert result.ok and result.skipped and "not a unix socket" in result.detail
    spec = replace(spec, node_health_check_endpoint="unix:///run/none.sock")
    [result] = suite.run_checks(spec, {}, {}, FakeReads(node="no daemon here").readers())
    assert result.ok and result.skipped and result.detail == "no daemon here"
