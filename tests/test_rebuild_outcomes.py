"""What `packtrain rebuild` says is what happened (attack 53, 2026-12-06). Before: a CURRENT build whose manifest
was cut short, or whose shard was, was "up-to-date" every run (the line carried the manifest's error, the exit
code was 0), and a prune that failed (a damaged run.json) exited 0 with the expert "rebuilt"."""

from __future__ import annotations

import json

import pytest

from build_fixtures import make_project
from packtrain.core.contract import read_current, verify_checksums, Manifest
from packtrain.pipeline.orchestrate.rebuild import EXIT_FAILED, EXIT_OK, RebuildOptions, rebuild


@pytest.fixture
def project(tmp_path):
    project = make_project(tmp_path, n_rows=40)
    project["runs"] = tmp_path / "runs"
    return project


def rebuild_sql(project) -> tuple[int, dict, list[str]]:
    lines, said = [], []
    options = RebuildOptions(keep=1, overrides={"train.output_dir": str(project["runs"])})
    code = rebuild(["sql"], project["configs"], project["cache"], options, lines.append, said.append)
    assert len(lines) == 1
    return code, json.loads(lines[0]), said


@pytest.mark.parametrize("damage", ["manifest cut short", "shard cut short", "shard missing"])
def test_a_damaged_current_build_is_built_again_not_called_up_to_date(project, damage):
    code, first, _ = rebuild_sql(project)
    build_id = first["new_build"]
    build_dir = project["cache"] / "sql" / build_id
    shard = build_dir / "train-00000.arrow"
    if damage == "manifest cut short":
        (build_dir / "manifest.json").write_text((build_dir / "manifest.json").read_text()[:200])
        why = (f"{build_dir / 'manifest.json'} is damaged (not valid JSON: Expecting value: line 10 column 20 "
               f"(char 200)); delete {build_dir} and rebuild it with `packtrain pretokenize sql`")
    elif damage == "shard cut short":
        size = shard.stat().st_size
        shard.write_bytes(shard.read_bytes()[:100])
        why = f"{shard}: 100 bytes, manifest says {size}"
    else:
        shard.unlink()
        why = f"{shard}: missing"
    code, line, said = rebuild_sql(project)
    assert (code, line["action"], line["old_build"], line["new_build"]) == (EXIT_OK, "rebuilt", build_id, build_id)
    assert "error" not in line
    assert f"build {build_id} of sql is damaged ({why}): building it again" in said
    assert read_current(project["cache"], "sql") == build_id
    assert verify_checksums(build_dir, Manifest.load(build_dir)) == []
    code, line, _ = rebuild_sql(project)
    assert (code, line["action"]) == (EXIT_OK, "up-to-date")


def test_a_prune_that_fails_exits_1_and_says_why(project):
    run = project["runs"] / "sql" / "run-1"
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"build_id": None}))  # damaged: which build it needs is unknown
    code, line, _ = rebuild_sql(project)
    assert (code, line["action"]) == (EXIT_FAILED, "rebuilt")
    assert line["error"] == (f"ContractError: {run / 'run.json'} is damaged (no build id in it: None), so no build of "
                             "sql is pruned; repair or delete that file (or its run directory)")
