"""The run directory's read side (packtrain/core/rundir.py): run.json's record, the runs of an
expert, the last run of a build, the newest logged run, the newest finished run."""

from __future__ import annotations

import json
import os

from packtrain.core.rundir import RunRecord, last_run, newest_finished_run, newest_logged_run, run_dirs


def make_run(runs, name: str, record, mtime_ns: int, finished: bool = False, metrics: bool = False):
    run = runs / name
    run.mkdir(parents=True)
    (run / "run.json").write_text(record if isinstance(record, str) else json.dumps(record))
    os.utime(run / "run.json", ns=(mtime_ns, mtime_ns))
    if finished:
        (run / "summary.json").write_text("{}")
        os.utime(run / "summary.json", ns=(mtime_ns, mtime_ns))
        (run / "adapter").mkdir()
    if metrics:
        (run / "metrics.jsonl").write_text("{}\n")
        os.utime(run / "metrics.jsonl", ns=(mtime_ns, mtime_ns))
    return run


def test_run_record_reads_what_the_commands_use_and_none_when_damaged(tmp_path):
    run = make_run(tmp_path, "a", {"build_id": "0123456789abcdef", "build_dir": "/c/sql/0123456789abcdef",
                                   "device": "cpu", "model": "bundled"}, 1)
    assert RunRecord.read(run) == RunRecord(run, "0123456789abcdef", "/c/sql/0123456789abcdef", "cpu")
    assert RunRecord.read(make_run(tmp_path, "b", {"build_id": 7, "device": "cuda:0"}, 1)).device == "cuda:0"
    assert RunRecord.read(tmp_path / "b").build_id is None
    assert RunRecord.read(make_run(tmp_path, "c", "[1, 2]", 1)) is None
    assert RunRecord.read(make_run(tmp_path, "d", "{not json", 1)) is None
    assert RunRecord.read(tmp_path / "missing") is None


def test_last_run_newest_logged_and_newest_finished(tmp_path):
    runs, other = tmp_path / "runs" / "sql", tmp_path / "elsewhere" / "sql"
    make_run(runs, "old", {"build_id": "aaaaaaaaaaaaaaaa"}, 10**18, finished=True, metrics=True)
    make_run(runs, "new", {"build_id": "aaaaaaaaaaaaaaaa"}, 3 * 10**18, metrics=True)
    make_run(runs, "damaged", "{", 4 * 10**18)
    make_run(other, "moved", {"build_id": "aaaaaaaaaaaaaaaa"}, 2 * 10**18, finished=True)
    make_run(other, "b", {"build_id": "bbbbbbbbbbbbbbbb"}, 5 * 10**18)
    assert sorted(p.name for p in run_dirs(runs)) == ["damaged", "new", "old"]
    assert run_dirs(tmp_path / "none") == []
    assert last_run([runs, other, runs], "aaaaaaaaaaaaaaaa") == runs / "new"
    assert last_run([other], "aaaaaaaaaaaaaaaa") == other / "moved"
    assert last_run([runs], "cccccccccccccccc") is None
    assert newest_logged_run(runs) == runs / "new"
    assert newest_logged_run(other) is None
    assert newest_finished_run(runs) == runs / "old"
    assert newest_finished_run(tmp_path / "none") is None
