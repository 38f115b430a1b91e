"""Per-cycle application logs (``workers.cyclelog``): NVRx's line format, partial and long lines, the
driver-noise filter, several streams in one file, a file that cannot be written."""

from __future__ import annotations

import stat

import pytest

from mbr_launch.workers.cyclelog import LINE_CAP, CycleLogs, driver_noise, rank_prefix

pytestmark = pytest.mark.timeout(10)


def test_rank_prefix_is_right_aligned_to_the_largest_rank():
    assert rank_prefix(0, 1) == "0: "
    assert rank_prefix(3, 10) == "3: "
    assert rank_prefix(3, 16) == " 3: "
    assert rank_prefix(12, 16) == "12: "
    assert rank_prefix(7, 1000) == "  7: "


@pytest.mark.parametrize("line, noise", [("Character devices:", True), ("  195 nvidia", True), ("1 mem", True),
                                         ("252 device-mapper", True), ("loss 0.5", False), ("", False),
                                         ("1234 toolong", False), ("1 mem" + " " * 70, False)])
def test_driver_noise_is_nvrx_s_filter(line, noise):
    assert driver_noise(line) is noise


def test_lines_of_every_stream_go_to_their_cycle_s_file(tmp_path):
    logs = CycleLogs(str(tmp_path / "logs" / "job.log"), warn=pytest.fail)
    out0, err0 = logs.sink(2, 0, 16), logs.sink(2, 0, 16)
    out12 = logs.sink(2, 12, 16)
    out0.write(b"step 1\nstep")
    out12.write(b"hello from twelve\n")
    out0.write(b" 2\n")
    err0.write(b"bad \xff byte and a \x00 NUL\nCharacter devices:\n  1 mem\nno end")
    for sink in (out0, err0, out12):
        sink.close()
    path = tmp_path / "logs" / "job_cycle2.log"
    assert path.read_text().splitlines() == [" 0: step 1", "12: hello from twelve", " 0: step 2",
                                             " 0: bad \ufffd byte and a <NUL> NUL", " 0: no end"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert not (tmp_path / "logs" / "job_cycle0.log").exists()


def test_a_line_longer_than_the_cap_is_written_on_in_pieces(tmp_path):
    logs = CycleLogs(str(tmp_path / "job"), warn=pytest.fail)
    sink = logs.sink(0, 1, 2)
    sink.write(b"x" * (LINE_CAP + 10))
    sink.write(b"y" * (LINE_CAP + 10))
    sink.write(b"z\nnext\n")
    sink.close()
    lines = (tmp_path / "job_cycle0.log").read_text().splitlines()
    assert lines == ["1: " + "x" * (LINE_CAP + 10) + "y" * (LINE_CAP + 10) + "z", "1: next"]


def test_cycles_append_and_a_later_launch_appends_too(tmp_path):
    prefix = str(tmp_path / "job.log")
    for cycle, text in ((0, b"a\n"), (1, b"b\n"), (0, b"c\n")):
        sink = CycleLogs(prefix, warn=pytest.fail).sink(cycle, 0, 1)
        sink.write(text)
        sink.close()
    assert (tmp_path / "job_cycle0.log").read_text() == "0: a\n0: c\n"
    assert (tmp_path / "job_cycle1.log").read_text() == "0: b\n"


def test_a_file_that_cannot_be_written_warns_once(tmp_path):
    (tmp_path / "job_cycle0.log").symlink_to(tmp_path / "elsewhere")  # never written through a symlink
    warnings: list[str] = []
    logs = CycleLogs(str(tmp_path / "job.log"), warn=warnings.append)
    sinks = [logs.sink(0, r, 2) for r in range(2)]
    for sink in sinks:
        sink.write(b"line\n")
        sink.close()
    assert len(warnings) == 1 and "cannot write the per-cycle log" in warnings[0]
    assert not (tmp_path / "elsewhere").exists()
