"""Cycle-info files and per-cycle names (``report.cycleinfo``): the names, the record's life, atomic writes,
and one check against NVRx 0.7.0 itself (its name helpers, and its protobuf parser reading our files)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from mbr_launch.report import cycleinfo
from mbr_launch.report.cycleinfo import CycleInfo, Reporter, Writer

from testkit.nvrx_versions import nvrx_env

pytestmark = pytest.mark.timeout(20)

NODE_CASES = [["node001.cluster", "node002", "node005"], ["gpu7", "node001"], ["vm"], ["b", "a", "a"],
              ["nvl72134-T01", "nvl72134-T02"], ["x9", "x10", "y"], []]
RANK_CASES = [[0, 1, 2, 5, 6], [3], [], [2, 1, 0], [0, 2, 4]]
PREFIXES = ["/logs/job.log", "/logs/job", "/logs/run.txt", "/logs/a.b/job"]


def test_names():
    assert cycleinfo.info_name("123", 2, 7) == "cycle_info.123.2.7"
    assert cycleinfo.current_name("123") == "cycle_info.123.current"
    assert cycleinfo.cycle_log_file("/logs/job.log", 3) == "/logs/job_cycle3.log"
    assert cycleinfo.cycle_log_file("/logs/job", 0) == "/logs/job_cycle0.log"
    assert cycleinfo.cycle_log_file("rel/job.log", 1) == os.path.abspath("rel/job_cycle1.log")


def test_job_id_and_attempt_as_nvrx_takes_them():
    assert cycleinfo.namespace("given", {"SLURM_JOB_ID": "5", "SLURM_RESTART_COUNT": "2"}) == ("given", 2)
    assert cycleinfo.namespace("given", {}) == ("given", 0)
    assert cycleinfo.namespace(None, {"SLURM_JOB_ID": "5", "SLURM_ARRAY_JOB_ID": "4",
                                      "SLURM_RESTART_COUNT": "2"}) == ("4", 2)
    assert cycleinfo.namespace(None, {"SLURM_JOB_ID": "5", "SLURM_RESTART_COUNT": "x"}) == ("5", 0)
    assert cycleinfo.namespace(None, {}) == ("", 0)
    assert cycleinfo.current_path("/ci/nvrx/", None, {"SLURM_JOB_ID": "5"}) == "/ci/nvrx/cycle_info.5.current"


def test_members_in_slurm_notation():
    assert cycleinfo.nodelist(["node001.cluster", "node002", "node005"]) == "node[001-002,005]"
    assert cycleinfo.rank_ranges([0, 1, 2, 5, 6]) == "0-2,5-6"
    # ranks follow the nodes' order
    assert cycleinfo.active([("node003", 0), ("node001", 2), ("node002", 1)]) == ("node[001-003]", "2,1,0")


class Stamps:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> str:
        self.n += 1
        return f"T{self.n}"


def test_a_cycle_is_written_at_its_start_and_again_at_its_end():
    written: list[tuple[CycleInfo, bool]] = []
    rep = Reporter(lambda record, link: written.append((record, link)), job_id="77", attempt=1,
                   log_prefix="/logs/job.log", now=Stamps())
    rep.start(0, [("n1", 0), ("n2", 1)], ["n3"])
    rep.start(0, [("n1", 0), ("n2", 1), ("n3", 2)])  # re-formed to admit n3: the same cycle goes on
    rep.start(1, [("n1", 0)])  # a restart: cycle 0 ends, cycle 1 starts
    rep.end()
    rep.end()  # nothing open: nothing written
    rows = [(r.cycle_number, r.generation, r.cycle_start_time, r.cycle_end_time, r.active_nodes, r.active_ranks,
             r.standby_nodes, link) for r, link in written]
    assert rows == [(0, 0, "T1", "", "n[1-2]", "0-1", "n[3]", True),
                    (0, 1, "T1", "", "n[1-3]", "0-2", "", False),
                    (0, 2, "T1", "T2", "n[1-3]", "0-2", "", False),
                    (1, 0, "T3", "", "n[1]", "0", "", True),
                    (1, 1, "T3", "T4", "n[1]", "0", "", False)]
    assert {r.cycle_log_file for r, _ in written} == {"/logs/job_cycle0.log", "/logs/job_cycle1.log"}
    assert {(r.job_id, r.attempt_index) for r, _ in written} == {("77", 1)}


def test_the_writer_replaces_files_and_the_link_whole(tmp_path):
    writer = Writer(str(tmp_path / "nvrx"), warn=pytest.fail)
    first = CycleInfo(job_id="9", attempt_index=0, cycle_number=0, cycle_start_time="T1", active_nodes="vm")
    writer(first, True)
    writer(CycleInfo(job_id="9", attempt_index=0, cycle_number=0, cycle_start_time="T1", cycle_end_time="T2",
                     generation=1), False)
    writer(CycleInfo(job_id="9", attempt_index=0, cycle_number=1, cycle_start_time="T3"), True)
    writer.close()
    folder = tmp_path / "nvrx"
    assert sorted(p.name for p in folder.iterdir()) == ["cycle_info.9.0.0", "cycle_info.9.0.1",
                                                        "cycle_info.9.current"]
    assert os.readlink(folder / "cycle_info.9.current") == "cycle_info.9.0.1"  # relative, as NVRx links
    data = json.loads((folder / "cycle_info.9.0.0").read_text())
    assert (data["cycle_end_time"], data["generation"], data["active_nodes"]) == ("T2", "1", "")
    assert list(data) == ["job_id", "attempt_index", "cycle_number", "cycle_start_time", "cycle_end_time",
                          "cycle_log_file", "active_nodes", "standby_nodes", "generation", "active_ranks"]


def test_a_folder_that_cannot_be_written_warns_once_and_the_job_goes_on(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    warnings: list[str] = []
    writer = Writer(str(blocker / "nvrx"), warn=warnings.append)
    for cycle in range(3):
        writer(CycleInfo(job_id="", attempt_index=0, cycle_number=cycle, cycle_start_time="T"), True)
    writer.close()
    assert len(warnings) == 1 and "cannot write the cycle-info file for cycle 0" in warnings[0]


NVRX_SIDE = textwrap.dedent("""
    import json, sys
    from google.protobuf import json_format
    from nvidia_resiliency_ext.fault_tolerance import cycle_info_writer as c, utils as u
    from nvidia_resiliency_ext.shared_utils.proto import nvrx_interface_pb2 as pb
    args = json.load(sys.stdin)
    parsed = [json_format.MessageToDict(json_format.Parse(open(p).read(), pb.NVRxCycleInfo()),
                                        preserving_proto_field_name=True) for p in args["files"]]
    print(json.dumps({
        "nodes": [u.hostnames_to_slurm_nodelist(n) for n in args["nodes"]],
        "ranks": [u.ranks_to_range_str(r) for r in args["ranks"]],
        "logs": [c.cycle_log_file(p, 4) for p in args["prefixes"]],
        "names": [c._cycle_info_filename("12", 3, 4), c._current_symlink_name("12")],
        "current": c.CycleInfoReporter.current_cycle_info_path("/ci/nvrx/", "12"),
        "parsed": parsed}))
""")


@pytest.mark.processes
@pytest.mark.timeout(90)
def test_nvrx_0_7_reads_our_files_and_names_things_as_we_do(tmp_path):
    writer = Writer(str(tmp_path), warn=pytest.fail)
    record = CycleInfo(job_id="12", attempt_index=3, cycle_number=4, cycle_start_time=cycleinfo.utc_now(),
                       cycle_end_time=cycleinfo.utc_now(), cycle_log_file="/logs/job_cycle4.log",
                       active_nodes="node[001-002]", standby_nodes="node003", generation=2, active_ranks="0-1")
    writer.write(record, True)
    args = {"nodes": NODE_CASES, "ranks": RANK_CASES, "prefixes": PREFIXES,
            "files": [str(tmp_path / record.name), str(tmp_path / cycleinfo.current_name("12"))]}
    done = subprocess.run([sys.executable, "-c", NVRX_SIDE], input=json.dumps(args), capture_output=True, text=True,
                          env=nvrx_env("0.7.0"), timeout=80)
    assert done.returncode == 0, done.stderr
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    assert theirs["nodes"] == [cycleinfo.nodelist(n) for n in NODE_CASES]
    assert theirs["ranks"] == [cycleinfo.rank_ranges(r) for r in RANK_CASES]
    assert theirs["logs"] == [cycleinfo.cycle_log_file(p, 4) for p in PREFIXES]
    assert theirs["names"] == [cycleinfo.info_name("12", 3, 4), cycleinfo.current_name("12")]
    assert theirs["current"] == cycleinfo.current_path("/ci/nvrx/", "12", {})
    ours = json.loads(record.to_json())
    assert theirs["parsed"] == [ours, ours]  # through the .current link too
