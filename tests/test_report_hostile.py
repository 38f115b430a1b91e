"""``mbr-launch report`` on a run folder someone else wrote: a neighbour's folder in a shared --log-dir, or a
worker's output quoted in an event. Whatever is in it, the report shows escapes as text (nothing reaches the
terminal), skips and counts a bad record, reads regular files only and only so much of them, draws labels as
plain text, and fails with exit code 2 and one line, never a traceback (exit 4) nor a hang or an out-of-memory.

Most tests call the Python API on files written here; the ones whose failure on a regression would be a hang
or a machine out of memory run ``python -m mbr_launch report`` as a child with a deadline and an address-space
limit (``RLIMIT_AS``), so a regression fails the test instead.
"""

from __future__ import annotations

import io
import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Sequence

import pytest

from mbr_launch.cli.app import main
from mbr_launch.report.render_text import print_report
from mbr_launch.report.runs import find_run
from mbr_launch.report.timeline import build

from testkit.helpers import LAUNCHER, REPO

DATA = Path(__file__).parent / "data" / "report"
CRASH_LOOP = DATA / "crash_loop" / "none_8cf387_vm" / "events.jsonl"
NOWHERE = Path("/nonexistent-mbr-launch-base")
GiB = 1 << 30
RAW = ("\x1b", "\x07", "\x9b", "\u202e")  # ESC, BEL (ends an OSC), CSI, a bidi override

pytestmark = pytest.mark.timeout(30)


def _records() -> list[dict]:
    return [json.loads(line) for line in CRASH_LOOP.read_text().splitlines()]


def _write(folder: Path, records: list, *, raw: Sequence[str] = ()) -> Path:
    """A run folder whose events.jsonl holds ``records`` (dicts dumped, strings written as they are), with
    the lines of ``raw`` inserted after the first."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
    lines[1:1] = raw
    (folder / "events.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def _text(folder: Path) -> str:
    out = io.StringIO()
    print_report(build(find_run(folder, NOWHERE)), stream=out, width=100)
    return out.getvalue()


def _report(*args: str, timeout: float = 30, memory: int = GiB) -> subprocess.CompletedProcess:
    """``mbr-launch report ARGS`` in a child limited to ``memory`` bytes of address space and ``timeout``
    seconds."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

    env = dict(os.environ, COLUMNS="100", PYTHONPATH=os.pathsep.join(filter(None, [str(REPO),
                                                                                   os.environ.get("PYTHONPATH")])))
    return subprocess.run([*LAUNCHER, "report", *args], capture_output=True, text=True, errors="replace",
                          env=env, cwd=REPO, timeout=timeout, preexec_fn=limit)


def _one_line_error(err: str, *words: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mbr-launch: error: "), err
    assert "Traceback" not in err and "internal error" not in err, err
    assert all(w in lines[0] for w in words), (words, err)


# ---- (1) control characters are shown, never sent ------------------------------------------------------


def test_escapes_in_event_fields_are_shown_not_sent(tmp_path):
    records = _records()
    for r in records:
        r["node"] = "vm\x1b]0;owned\x07"  # OSC: sets the window title
    records[0]["run_id"] = "\u202eevil"
    records[0]["argv"].append("\x1b[2J")
    failure = next(r for r in records if r["event"] == "failure")
    failure.update(detail="\x1b[1A\x1b[2K[mbr-launch vm] all good", cause="crash\x9b31m", section="s\x1b[5m")
    next(r for r in records if r["event"] == "progress")["cause_detail"] = "died\x1b[31m"
    records[-1]["reason"] = "done\r\x1b[Kforged"
    text = _text(_write(tmp_path / "run", records))
    assert not any(c in text for c in RAW + ("\r",)), repr(text)
    assert "vm\\x1b]0;owned\\x07" in text and "\\u202eevil" in text and "\\x1b[1A\\x1b[2K[mbr-launch vm]" in text
    assert "crash\\x9b31m" in text and "died\\x1b[31m" in text and "done\\r\\x1b[Kforged" in text


def test_escapes_in_folder_names_are_shown_not_sent(tmp_path, capsys):
    folder = _write(tmp_path / "run\x1b]0;owned\x07", _records())
    text = _text(folder)
    assert "run\\x1b]0;owned\\x07" in text and not any(c in text for c in RAW), repr(text)
    assert main(["report", str(tmp_path / "nope\x1b[2J")]) == 2
    _one_line_error(capsys.readouterr().err, "nope\\x1b[2J")


def test_text_that_cannot_be_written_as_utf8_is_shown_as_escapes(tmp_path, monkeypatch):
    """A lone surrogate in the JSON, a folder name that is not UTF-8: printing either raised
    UnicodeEncodeError (exit 4) on a terminal's strict UTF-8 stdout."""
    records = _records()
    next(r for r in records if r["event"] == "failure")["detail"] = "\ud800"  # json.dumps writes \\ud800
    folder = _write(tmp_path / os.fsdecode(b"run\xff"), records)
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict")
    monkeypatch.setattr(sys, "stdout", out)
    assert main(["report", str(folder)]) == 0
    out.flush()
    text = out.buffer.getvalue().decode("utf-8")
    assert "\\ud800" in text and "run\\udcff" in text, text


# ---- (2) bad records: skipped and counted; a file that cannot be read at all: exit 2, one line ----------


BAD_RECORDS = {
    "rank_not_int": {"event": "failure", "t": 1.0, "ts": "2026-11-30T23:47:05+00:00", "rank": "x"},
    "ts_a_list": {"event": "failure", "t": 1.0, "ts": [], "rank": 1},
    "node_a_dict": {"event": "failure", "t": 1.0, "ts": "x", "node": {"a": {"b": 1}}},
    "detail_a_dict": {"event": "failure", "t": 1.0, "ts": "x", "detail": {"text": "\x1b[2J"}},
    "round_a_list": {"event": "rendezvous", "t": 1.0, "ts": "x", "round": [7], "world_size": 2},
    "t_a_string": {"event": "worker_start", "t": "1", "ts": "x"},
    "backoff_a_string": {"event": "restart", "t": 1.0, "ts": "x", "round": 1, "backoff": "soon"},
    "started_null": {"event": "progress", "t": 1.0, "ts": "x", "round": 5, "started": None, "ended": 2.0},
    "steps_a_word": {"event": "progress", "t": 1.0, "ts": "x", "round": 5, "started": 1.0, "ended": 2.0,
                     "first_step": 1.0, "last_step": 2.0, "steps": "many"},
    "rank_a_bool": {"event": "failure", "t": 1.0, "ts": "x", "rank": True},
    "huge_int_t": {"event": "failure", "t": 10 ** 400, "ts": "x", "rank": 1},
    "huge_exit_code": {"event": "failure", "t": 1.0, "ts": "x", "exit_code": 2 ** 70},
    "not_an_object": [1, 2, 3],
    # written as text: JSON that json.dumps would not write
    "nan_t": '{"event": "failure", "t": NaN, "ts": "x", "rank": 1}',
    "infinite_t": '{"event": "failure", "t": 1e400, "ts": "x", "rank": 1}',
    "minus_infinity": '{"event": "progress", "t": 1.0, "ts": "x", "started": -Infinity, "ended": 2.0}',
    "int_of_5000_digits": '{"event": "failure", "t": 1.0, "ts": "x", "exit_code": 1' + "0" * 5000 + "}",
    "nested_100000_deep": "[" * 100_000 + "]" * 100_000,
    "not_json": "{not json",
    "not_utf8": b"\xff\xfe{}".decode("latin-1"),
}


@pytest.mark.parametrize("name", sorted(BAD_RECORDS))
def test_a_bad_record_is_skipped_and_counted(tmp_path, capsys, name):
    bad = BAD_RECORDS[name]
    folder = tmp_path / "run"
    _write(folder, _records(), raw=[bad if isinstance(bad, str) else json.dumps(bad)])
    if name == "not_utf8":
        data = (folder / "events.jsonl").read_text().encode("latin-1")
        (folder / "events.jsonl").write_bytes(data)
    assert main(["report", str(folder)]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    assert "1 record(s) skipped" in captured.out and "(the first: line 2: " in captured.out, captured.out
    assert "3 failure(s)" in captured.out  # the good records are all there


START_LINES = {
    "nested_100000_deep": "[" * 100_000 + "]" * 100_000,
    "nan_t": '{"event": "start", "t": NaN, "ts": "2026-11-30T23:47:04+00:00", "run_id": "r"}',
    "run_id_a_dict": json.dumps({"event": "start", "t": 0.0, "ts": "2026-11-30T23:47:04+00:00",
                                 "run_id": {"x": "y"}}),
    "argv_a_number": json.dumps({"event": "start", "t": 0.0, "ts": "2026-11-30T23:47:04+00:00", "argv": 5}),
}


@pytest.mark.parametrize("name", sorted(START_LINES))
def test_a_log_whose_start_is_bad_exits_2_with_one_line(tmp_path, capsys, name):
    folder = _write(tmp_path / "run", [START_LINES[name], *_records()[1:]])
    assert main(["report", str(folder)]) == 2
    _one_line_error(capsys.readouterr().err, "events.jsonl")


# ---- (3) bounded reads: a long line is skipped as it streams by, a huge file is read only so far ------------


def test_bounded_lines_skip_a_long_line_without_holding_it(tmp_path):
    from mbr_launch.report.untrusted import open_file
    from mbr_launch.report.runs import BoundedLines

    path = tmp_path / "f"
    path.write_bytes(b"a" * 10 + b"\n" + b"b" * 1000 + b"\n" + b"c" * 10 + b"\n" + b"d" * 5)
    fd = open_file(path)
    try:
        lines = BoundedLines(fd, max_line=50)
        assert list(lines) == [(1, b"a" * 10, True), (3, b"c" * 10, True), (4, b"d" * 5, False)]
        assert lines.too_long == 1 and lines.unread == 0
        os.lseek(fd, 0, os.SEEK_SET)
        cut = BoundedLines(fd, max_bytes=20, max_line=50)
        assert list(cut) == [(1, b"a" * 10, True)]  # the line the bound cut is not parsed
        assert cut.unread == path.stat().st_size - 20
    finally:
        os.close(fd)


def test_a_line_over_the_bound_is_skipped_and_counted(tmp_path, capsys):
    records = _records()
    long_line = json.dumps({"event": "verdict", "t": 1.0, "ts": "x", "evidence": "x" * (5 << 20)})
    folder = _write(tmp_path / "run", records, raw=[long_line])
    assert main(["report", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "1 line(s) longer than 4 MiB skipped unread" in out and "3 failure(s)" in out, out


@pytest.mark.processes
@pytest.mark.timeout(90)
def test_a_400_mib_line_costs_no_more_than_the_bound(tmp_path):
    """The line is a hole in a sparse file (no disk used). The child may use 256 MiB of address space: the
    report needs about 40 MB resident here, holding the line would take more than 800 MiB."""
    folder = tmp_path / "run"
    folder.mkdir()
    records = _records()
    with open(folder / "events.jsonl", "wb") as f:
        f.write((json.dumps(records[0]) + "\n").encode())
        f.truncate(400 << 20)  # 400 MiB of NUL bytes: one line, not ended yet
        f.seek(0, os.SEEK_END)
        f.write(b"\n" + "\n".join(json.dumps(r) for r in records[1:]).encode() + b"\n")
    res = _report(str(folder), timeout=60, memory=256 << 20)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "1 line(s) longer than 4 MiB skipped unread" in res.stdout, res.stdout
    assert "only the first 64 MiB read" in res.stdout, res.stdout


# ---- (4) regular files only: no /dev/zero through a symlink, no FIFO, no one else's folder -----------------


@pytest.mark.processes
@pytest.mark.timeout(60)
@pytest.mark.parametrize("plant, why", [
    (lambda p: p.symlink_to("/dev/zero"), "symlink"),  # read until memory ran out
    (os.mkfifo, "not a regular file"),  # hung the report
])
def test_a_log_that_is_no_regular_file_exits_2_at_once(tmp_path, plant, why):
    folder = tmp_path / "run"
    folder.mkdir()
    plant(folder / "events.jsonl")
    res = _report(str(folder), timeout=20)
    assert res.returncode == 2, res.stderr[-2000:]
    _one_line_error(res.stderr, "events.jsonl", why)


@pytest.mark.processes
@pytest.mark.timeout(60)
def test_a_neighbours_fifo_in_a_shared_log_dir_does_not_hang_our_report(tmp_path):
    logs = tmp_path / "logs"
    shutil.copytree(DATA / "two_nodes", logs)
    (logs / "neighbour").mkdir()
    os.mkfifo(logs / "neighbour" / "events.jsonl")
    res = _report(str(logs / "job51453_204ec4_vm"), timeout=20)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "2 node(s)" in res.stdout


def _two_nodes_and_an_impostor(tmp_path: Path) -> tuple[Path, Path]:
    """The recorded two-node run, and a third folder claiming to be a node of it (same run id and time)."""
    logs = tmp_path / "logs"
    shutil.copytree(DATA / "two_nodes", logs)
    impostor = tmp_path / "elsewhere" / "job51453_666666_vm"
    impostor.parent.mkdir()
    shutil.copytree(logs / "job51453_204ec4_vm", impostor)
    return logs, impostor


def test_a_sibling_folder_that_links_elsewhere_is_no_node_of_the_run(tmp_path):
    logs, impostor = _two_nodes_and_an_impostor(tmp_path)
    (logs / impostor.name).symlink_to(impostor)
    run = build(find_run(logs / "job51453_f57d2b_vm", NOWHERE))
    assert sorted(lane.path.parent.name for lane in run.lanes) == ["job51453_204ec4_vm", "job51453_f57d2b_vm"]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a folder to another user")
def test_another_users_folder_claiming_our_run_id_is_left_out(tmp_path):
    logs, impostor = _two_nodes_and_an_impostor(tmp_path)
    planted = logs / impostor.name
    shutil.move(impostor, planted)
    for path in (planted, planted / "events.jsonl"):
        os.chown(path, 65534, 65534)
    run = build(find_run(logs / "job51453_f57d2b_vm", NOWHERE))
    assert sorted(lane.path.parent.name for lane in run.lanes) == ["job51453_204ec4_vm", "job51453_f57d2b_vm"]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a link to another user")
def test_another_users_latest_link_is_not_followed(tmp_path):
    base = tmp_path / "base"
    shutil.copytree(DATA / "two_nodes", base)
    theirs = tmp_path / "theirs"
    shutil.copytree(DATA / "crash_loop", theirs)
    (base / "latest").symlink_to(theirs / "none_8cf387_vm")
    os.lchown(base / "latest", 65534, 65534)
    assert build(find_run(None, base)).run_id == "job51453"  # the newest log of ours, not their run "none"


# ---- matplotlib: labels are text, not math ----------------------------------------------------------------


def test_dollar_signs_in_labels_are_drawn_as_written(tmp_path):
    pytest.importorskip("matplotlib")
    from mbr_launch.report.render_plot import svg

    records = _records()
    for r in records:
        r["node"] = "$x^^$"  # not math: matplotlib's math mode raises on it
    records[0]["run_id"] = r"$\frac{a}{b}$"
    next(r for r in records if r["event"] == "failure")["cause"] = r"$\nosuchcommand$"
    drawing = svg(build(find_run(_write(tmp_path / "run", records), NOWHERE)))
    assert all(text in drawing for text in ("$x^^$", r"$\frac{a}{b}$", r"$\nosuchcommand$")), drawing


# ---- a worker's error file, read by the agent for its summary ---------------------------------------------


def test_a_workers_error_file_of_any_shape_is_read_safely(tmp_path):
    from mbr_launch.report.summary import ErrorFile

    path = tmp_path / "error.json"
    for data in ("[1, 2]", '"just text"', '{"message": 7}', "[" * 100_000, '{"message": {"extraInfo": []}}'):
        path.write_text(data)
        found = ErrorFile.read(path)
        assert found is None or isinstance(found.message, str), data
    path.write_text(json.dumps({"message": {"message": "boom\x1b[2J\ud800", "extraInfo": {
        "py_callstack": "Traceback\n  line\x1b]0;t\x07\udcff\n", "timestamp": "12"}}}))
    found = ErrorFile.read(path)
    assert found is not None and found.message == "boom\\x1b[2J\\ud800" and found.timestamp == 12
    assert found.traceback == "Traceback\n  line\\x1b]0;t\\x07\\udcff\n"
    path.unlink()
    os.mkfifo(path)  # would block an open for reading until a writer came
    assert ErrorFile.read(path) is None
