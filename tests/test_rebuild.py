"""Scheduled rebuilds: cheap change detection, per-source re-tokenization, retention, status."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from filelock import FileLock

import packtrain.pipeline.orchestrate.build
import packtrain.pipeline.hashcache
from build_fixtures import make_project, rows, write_jsonl
from packtrain.pipeline.orchestrate.build import build, plan
from packtrain.pipeline.pack.spill import SOURCES
from packtrain.core.configfile import load_config
from packtrain.core.contract import read_current
from packtrain.pipeline.orchestrate.rebuild import REBUILD_LOCK, prune_builds
from packtrain.pipeline.review.status import expert_status

ROOT = Path(__file__).resolve().parents[1]


def quiet(*_):
    pass


@pytest.fixture
def two_sources(tmp_path):
    """The sql expert over two local jsonl sources: a.jsonl (40 rows) and b.jsonl (30 rows)."""
    project = make_project(tmp_path, n_rows=40)
    a = project["data"]
    b = write_jsonl(a.parent / "b.jsonl", rows(30, start=500))
    config = project["configs"] / "sql.yaml"
    config.write_text(config.read_text().replace(f"  - name: {a}\n", f"  - name: {a}\n  - name: {b}\n"))
    project["b"] = b
    project["runs"] = tmp_path / "runs"
    return project


def run_build(project, **overrides):
    overrides.setdefault("train.output_dir", str(project["runs"]))
    return build(load_config("sql", project["configs"], overrides), project["cache"], log=quiet, progress=False)


def shard_bytes(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.glob("*.arrow"))} | {"manifest": (path / "manifest.json").read_bytes()}


def cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "packtrain.cli", *map(str, args)], cwd=cwd, capture_output=True, text=True)


def test_only_the_changed_source_is_tokenized_again(two_sources, monkeypatch):
    first = run_build(two_sources)
    write_jsonl(two_sources["b"], rows(35, start=500))  # b grows by 5 rows, a is untouched
    tokenized = []
    real = packtrain.pipeline.orchestrate.build.tokenize_sources
    monkeypatch.setattr(packtrain.pipeline.orchestrate.build, "tokenize_sources",
                        lambda job, *rest, **kw: (tokenized.extend(job.todo), real(job, *rest, **kw))[1])
    second = run_build(two_sources)
    assert tokenized == [1]
    report = second.report
    assert [s["reused"] for s in report["sources"]] == [True, False]
    assert report["previous"]["build_id"] == first.build_id
    assert report["previous"]["sources_changed"] == ["b.jsonl"]  # local sources are named by file, not path
    assert report["previous"]["sources_added"] == [] and report["previous"]["inputs_changed"] == []
    assert report["previous"]["delta"]["train"]["documents"] + report["previous"]["delta"]["val"]["documents"] == 5

    # reusing a's tokens gives exactly the bytes of a build from scratch
    incremental = shard_bytes(second.path)
    shutil.rmtree(two_sources["cache"])
    assert shard_bytes(run_build(two_sources).path) == incremental


def test_the_summary_says_which_input_made_a_new_build(two_sources, monkeypatch):
    """A source read another way (its weight, columns, where) and the pipeline's own version are named:
    the summary said "no input changed" for both, over a new build id."""
    import packtrain.pipeline.orchestrate.build as build_module

    first = run_build(two_sources)
    config = two_sources["configs"] / "sql.yaml"
    config.write_text(config.read_text().replace(f"  - name: {two_sources['b']}\n",
                                                 f"  - name: {two_sources['b']}\n    weight: 2\n"))
    second = run_build(two_sources)
    assert second.build_id != first.build_id
    assert (second.report["previous"]["sources_changed"], second.report["previous"]["inputs_changed"]) == (["b.jsonl"], [])
    monkeypatch.setattr(build_module, "PIPELINE_VERSION", build_module.PIPELINE_VERSION + 1)
    third = run_build(two_sources)
    assert (third.report["previous"]["sources_changed"], third.report["previous"]["inputs_changed"]) == \
        ([], ["pipeline_version"])


def test_unchanged_files_are_not_hashed_again(two_sources, monkeypatch):
    config = load_config("sql", two_sources["configs"])
    first = plan(config, two_sources["cache"])[3]
    hashed = []
    real = packtrain.pipeline.hashcache.sha256_file
    monkeypatch.setattr(packtrain.pipeline.hashcache, "sha256_file", lambda p: (hashed.append(Path(p).name), real(p))[1])
    assert plan(config, two_sources["cache"])[3] == first
    assert hashed == []
    os.utime(two_sources["b"], None)  # touched: stat changed, content not
    assert plan(config, two_sources["cache"])[3] == first
    assert hashed == ["b.jsonl"]


def test_rebuild_cli_json_lines_and_exit_codes(two_sources):
    configs, cache = two_sources["configs"], two_sources["cache"]
    (configs / "broken.yaml").write_text("sources:\n  - name: nobody/nothing\n")
    args = ("rebuild", "--all", "--configs-dir", configs, "--cache-dir", cache)
    first = cli(*args)
    lines = {json.loads(line)["expert"]: json.loads(line) for line in first.stdout.splitlines()}
    assert first.returncode == 1  # broken failed
    assert lines["sql"]["action"] == "rebuilt" and lines["sql"]["old_build"] is None
    assert lines["sql"]["token_delta"] > 0
    assert lines["broken"]["action"] == "failed" and "nobody/nothing" in lines["broken"]["error"]
    (configs / "broken.yaml").unlink()

    second = cli(*args)
    assert second.returncode == 0, second.stderr
    line = json.loads(second.stdout)
    assert (line["action"], line["old_build"], line["new_build"]) == ("up-to-date", lines["sql"]["new_build"],
                                                                      lines["sql"]["new_build"])

    write_jsonl(two_sources["data"], rows(41))
    third = json.loads(cli(*args).stdout)
    assert third["action"] == "rebuilt" and third["old_build"] == lines["sql"]["new_build"]
    assert read_current(cache, "sql") == third["new_build"] != third["old_build"]


def test_a_second_rebuild_waits_or_exits_cleanly(two_sources):
    cache = two_sources["cache"]
    cache.mkdir(exist_ok=True)  # it may hold the seeded encoder decision
    with FileLock(str(cache / REBUILD_LOCK)):
        skipped = cli("rebuild", "sql", "--no-wait", "--configs-dir", two_sources["configs"], "--cache-dir", cache)
    assert skipped.returncode == 3
    assert json.loads(skipped.stdout)["action"] == "skipped"
    assert read_current(cache, "sql") is None


def test_retention_keeps_current_recent_and_checkpointed_builds(two_sources):
    ids = []
    for n in (40, 41, 42, 43):
        write_jsonl(two_sources["data"], rows(n))
        ids.append(run_build(two_sources).build_id)
    checkpoint = two_sources["runs"] / "sql" / "run-1" / "checkpoint-10"
    checkpoint.mkdir(parents=True)
    (checkpoint / "state.json").write_text(json.dumps({"build_id": ids[0], "step": 10}))
    running = two_sources["runs"] / "sql" / "run-2"  # started on ids[1], no checkpoint or summary yet
    running.mkdir()
    (running / "run.json").write_text(json.dumps({"build_id": ids[1]}))
    finished = two_sources["runs"] / "sql" / "run-3"
    finished.mkdir()
    (finished / "run.json").write_text(json.dumps({"build_id": ids[1]}))
    (finished / "summary.json").write_text("{}")
    assert prune_builds(two_sources["cache"], "sql", keep=2, runs_dir=two_sources["runs"] / "sql") == []
    (running / "summary.json").write_text("{}")  # that run finished: ids[1] is free to go
    removed = prune_builds(two_sources["cache"], "sql", keep=2, runs_dir=two_sources["runs"] / "sql")
    assert sorted(removed) == sorted([ids[1]])
    left = sorted(p.name for p in (two_sources["cache"] / "sql").iterdir() if p.is_dir() and not p.name.startswith("."))
    assert left == sorted([ids[0], ids[2], ids[3]])
    # b.jsonl's tokens are shared by every build; a.jsonl keeps one cache per kept build
    cached = [p for p in (two_sources["cache"] / "sql" / SOURCES).iterdir() if not p.name.startswith(".")]
    assert len(cached) == 1 + 3


def test_status_reports_changes_and_the_last_run(two_sources):
    built = run_build(two_sources)
    run_dir = two_sources["runs"] / "sql" / "20261122-000000-x"
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({"build_id": built.build_id}))
    overrides = {"train.output_dir": str(two_sources["runs"])}
    (status,) = expert_status("sql", two_sources["configs"], two_sources["cache"], overrides)
    assert status["build"] == built.build_id and status["inputs_changed"] is False
    assert status["last_run"] == "20261122-000000-x (unfinished)" and status["train_tokens"] > 0  # no summary yet
    (run_dir / "summary.json").write_text("{}")  # the run finished
    assert expert_status("sql", two_sources["configs"], two_sources["cache"], overrides)[0]["last_run"] == \
        "20261122-000000-x"
    write_jsonl(two_sources["b"], rows(31, start=500))
    assert expert_status("sql", two_sources["configs"], two_sources["cache"], overrides)[0]["inputs_changed"] is True
