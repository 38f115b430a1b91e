"""``mbr-launch report``: the run's model from recorded event logs, its text and its files, bad input, and one
real launch with a crash and a restart reported end to end.

The recorded logs in tests/data/report come from real launches: ``two_nodes`` (two agents sharing a
--log-dir, c10d rendezvous, rank 1 exits 3 at step 30 of the first attempt, then both train to the end) and
``crash_loop`` (a script without an optimizer whose rank 1 exits 3 on every attempt, restart budget 2).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from mbr_launch.cli.app import main
from mbr_launch.report import render_plot
from mbr_launch.report.render_text import GLYPH, story, timeline_rows
from mbr_launch.report.runs import LATEST, ReportError, find_run
from mbr_launch.report.timeline import OPEN, RUNNING, build

from testkit.helpers import LAUNCHER, REPO, SCRIPTS, launcher_env, run_launcher

DATA = Path(__file__).parent / "data" / "report"
NOWHERE = Path("/nonexistent-mbr-launch-base")

pytestmark = pytest.mark.timeout(30)


def _two_nodes(tmp_path: Path) -> Path:
    folder = tmp_path / "logs"
    shutil.copytree(DATA / "two_nodes", folder)
    return folder


def test_two_nodes_on_one_axis(tmp_path):
    run = build(find_run(_two_nodes(tmp_path), NOWHERE))
    assert run.run_id == "job51453" and run.exit_code == 0
    assert [lane.label for lane in run.lanes] == ["vm (node 0)", "vm (node 1)"]
    # the nodes launched 0.6 s apart: each lane starts at its own launch and ends at its own end event
    offsets = sorted(lane.offset for lane in run.lanes)
    assert offsets[0] == 0.0 and offsets[1] == pytest.approx(0.6, abs=0.05)
    for lane in run.lanes:
        segs = lane.segments
        assert segs[0].start == pytest.approx(lane.offset)
        assert segs[-1].end == pytest.approx(lane.offset + lane.goodput.wall)
        assert all(a.end == pytest.approx(b.start) for a, b in zip(segs, segs[1:]))
        kinds = [s.kind for s in segs if s.end - s.start > 1e-3]
        assert kinds == ["startup", "lost", "detection", "restart", "productive", "other"], kinds
    (failure,) = run.failures
    assert (failure.rank, failure.local_rank, failure.node, failure.cause, failure.exit_code, failure.round) == \
        (1, 0, "vm", "crash", 3, 0)
    assert failure.detection is not None and 0 <= failure.detection < 1
    assert failure.restart == pytest.approx(12.2, abs=0.1)
    assert [(r.index, r.failures) for r in run.rounds] == [(0, (1,)), (1, ())]
    assert run.rounds[0].then == "restart 1 of 1 (job scope)"
    text = "\n".join(story(run))
    assert "failure 1 at 10.0 s: rank 1 (local rank 0) on vm: crash, exit code 3; last section: -" in text
    assert "training again 12.2 s later" in text


def test_other_runs_in_a_shared_log_dir_are_left_out(tmp_path):
    folder = _two_nodes(tmp_path)
    # the same run id a day earlier (a rerun of the job with the same --rdzv-id): another run
    old = folder / "job51453_000000_vm"
    old.mkdir()
    lines = (folder / "job51453_204ec4_vm" / "events.jsonl").read_text().splitlines()
    shifted = []
    for line in lines:
        record = json.loads(line)
        record["ts"] = (datetime.fromisoformat(record["ts"]) - timedelta(days=1)).isoformat()
        shifted.append(json.dumps(record))
    (old / "events.jsonl").write_text("\n".join(shifted) + "\n")
    os.utime(old / "events.jsonl", (0, 0))  # the oldest: the latest run is still the real one
    run = build(find_run(folder / "job51453_f57d2b_vm", NOWHERE))
    assert sorted(lane.path.parent.name for lane in run.lanes) == ["job51453_204ec4_vm", "job51453_f57d2b_vm"]
    alone = build(find_run(old, NOWHERE))
    assert [lane.path.parent.name for lane in alone.lanes] == ["job51453_000000_vm"]


def test_latest_link_wins_over_the_newest_folder(tmp_path):
    base = tmp_path / "base"
    shutil.copytree(DATA / "crash_loop", base)
    newer = _two_nodes(tmp_path)
    for node in newer.iterdir():
        shutil.copytree(node, base / node.name)
        os.utime(base / node.name / "events.jsonl", (2e9, 2e9))  # a checkout's mtimes say nothing
    assert build(find_run(None, base)).run_id == "job51453"  # no link: the newest log
    (base / LATEST).symlink_to(base / "none_8cf387_vm")
    assert build(find_run(None, base)).run_id == "none"


def test_crash_loop_without_steps_is_drawn_as_running():
    run = build(find_run(DATA / "crash_loop", NOWHERE))
    (lane,) = run.lanes
    assert [s.kind for s in lane.segments if s.end - s.start > 1e-3] == \
        ["startup", RUNNING, "restart", RUNNING, "restart", RUNNING, "other"]
    assert [f.restart for f in run.failures] == [None, None, None]
    out = "\n".join(story(run))
    assert "training again" not in out
    assert out.count("restarted; no step seen since") == 2 and "not restarted" in out
    assert run.rounds[1].then == "restart 2 of 2 (job scope, back-off 1 s)"


def test_a_log_without_its_end_is_drawn_open(tmp_path):
    """A run still going (or a launcher killed): what follows the last attempt on record is not a wind-down."""
    node = tmp_path / "run"
    node.mkdir()
    lines = (DATA / "two_nodes" / "job51453_204ec4_vm" / "events.jsonl").read_text().splitlines()
    (node / "events.jsonl").write_text("\n".join(lines[:9]) + "\n")  # up to round 0's progress record
    run = build(find_run(node, NOWHERE))
    assert run.exit_code is None and "no end event" in run.reason
    (lane,) = run.lanes
    assert [s.kind for s in lane.segments][-2:] == ["detection", OPEN]


@pytest.mark.parametrize("width", [60, 100, 160])
def test_timeline_fits_the_width(width):
    run = build(find_run(DATA / "two_nodes", NOWHERE))
    rows = [row.plain for row in timeline_rows(run, width)]
    lanes = [row for row in rows if row.startswith("vm (node")]
    assert len(lanes) == 2 and all(len(row) == width for row in lanes)
    assert all(len(row) <= width for row in rows)
    for kind in ("startup", "lost", "restart", "productive"):
        assert GLYPH[kind] in lanes[0] + lanes[1]
    assert any("^1" in row for row in rows)  # the failure's mark under the lanes


def test_svg_holds_each_segment_and_the_failure():
    pytest.importorskip("matplotlib")
    run = build(find_run(DATA / "two_nodes", NOWHERE))
    root = ET.fromstring(render_plot.svg(run))
    ids = {el.get("id") for el in root.iter() if el.get("id")}
    expected = {f"segment-{s.kind}-{y}-{n}" for y, lane in enumerate(run.lanes) for n, s in enumerate(lane.segments)}
    assert expected <= ids
    assert {"failure-1", "round-0", "round-1"} <= ids
    page = render_plot.html_page(run)
    assert page.startswith("<!doctype html>") and "<svg" in page and "http" not in page.split("<svg")[0]
    assert "failure 1 at 10.0 s: rank 1" in page


def test_cli_writes_files_and_reports(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    svg, page = tmp_path / "t.svg", tmp_path / "t.html"
    assert main(["report", str(DATA / "two_nodes"), "--svg", str(svg), "--html", str(page)]) == 0
    out = capsys.readouterr().out
    assert "failure 1 at 10.0 s" in out and f"wrote {svg}" in out
    ET.parse(svg)
    assert "<svg" in page.read_text()


def test_files_without_matplotlib_exit_2_with_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    svg = tmp_path / "t.svg"
    assert main(["report", str(DATA / "two_nodes"), "--svg", str(svg)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and not svg.exists()
    assert captured.err.strip().splitlines() == [
        "mbr-launch: error: --svg and --html need matplotlib: pip install 'mbr-launch[report]'"]


def _bad(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    empty_dir = tmp_path / "empty_dir"
    empty_dir.mkdir()
    empty_log = tmp_path / "empty_log"
    empty_log.mkdir()
    (empty_log / "events.jsonl").write_text("")
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "events.jsonl").write_text('{"event": "start", "t": 0\nnot json\n')
    headless = tmp_path / "headless"
    headless.mkdir()
    (headless / "events.jsonl").write_text('{"event": "end", "t": 1.0, "ts": "2026-01-01T00:00:00+00:00"}\n')
    return {"missing": (tmp_path / "nope", "no such run folder"),
            "empty_dir": (empty_dir, "holds no run folder"), "empty_log": (empty_log, "is empty"),
            "corrupt": (corrupt, "not an mbr-launch event log"), "headless": (headless, "does not begin with a start")}


def test_bad_run_folders_exit_2_with_one_line(tmp_path, capsys):
    for name, (path, words) in _bad(tmp_path).items():
        assert main(["report", str(path)]) == 2, name
        captured = capsys.readouterr()
        lines = captured.err.strip().splitlines()
        assert len(lines) == 1 and words in lines[0] and "Traceback" not in captured.err, (name, captured.err)
        with pytest.raises(ReportError):
            find_run(path, NOWHERE)


def test_no_runs_yet_under_the_default_base(tmp_path):
    with pytest.raises(ReportError, match="no runs under"):
        find_run(None, tmp_path / "mbr-launch-0")


@pytest.mark.processes
@pytest.mark.timeout(150)
def test_real_crash_and_restart_reported_end_to_end(tmp_path):
    """A real launch (no --log-dir: the default base under TMPDIR), rank 1 exits 3 once, the restart trains to
    the end; then `mbr-launch report` with no argument finds it, names the failure and draws it."""
    env = launcher_env(TMPDIR=str(tmp_path), COLUMNS="100")
    res = run_launcher(["--nproc-per-node", "2", "--max-restarts", "1", "--status", "off", "--skip-check", "all",
                        str(SCRIPTS / "crash_once.py"), "--steps", "30", "--crash-rank", "1", "--crash-at-step", "10"],
                       env=env, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    # the summary's goodput block names its buckets and makes no claim the log does not hold
    # the summary's goodput block: each bucket with what it means, and the failure's true cost
    block = res.stderr.split("Goodput:")[1].splitlines()
    buckets = [line for line in block if line.startswith("  ") and "%" in line]
    assert buckets and all(len(line.split("%", 1)[1].strip()) > 20 for line in buckets), block
    assert any("failure 1 (round 0, crash)" in line and "training again" in line for line in block), block
    svg = tmp_path / "run.svg"
    plots = importlib.util.find_spec("matplotlib") is not None  # scripts/setup installs it; the text needs none
    rep = subprocess.run([*LAUNCHER, "report", *(["--svg", str(svg)] if plots else [])], capture_output=True,
                         text=True, env=env, cwd=REPO, timeout=60)
    assert rep.returncode == 0, rep.stderr
    out = rep.stdout
    assert "1 failure(s)" in out and "exit code 0: all workers succeeded" in out
    assert "failure 1 at" in out and "rank 1 (local rank 1) on" in out and "crash, exit code 3" in out
    assert "training again" in out and "then: restart 1 of 1 (job scope)" in out
    lane = next(line for line in out.splitlines() if line.endswith(tuple(GLYPH.values())) and "(node 0)" in line)
    assert len(lane) == 100 and GLYPH["productive"] in lane and GLYPH["restart"] in lane
    if not plots:
        return
    ids = {el.get("id") for el in ET.parse(svg).getroot().iter() if el.get("id")}
    assert {"failure-1", "round-0", "round-1"} <= ids
    for kind in ("startup", "productive", "restart", "other"):
        assert any(i.startswith(f"segment-{kind}-0-") for i in ids), (kind, sorted(ids))
