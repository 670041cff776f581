"""Issue 12, classes 1 and 5: a build's id describes the bytes it read; retention and names.

Class 1: the inputs are hashed (plan) before the expert's lock is taken and read after it. A hook
edits a file in between, or while it is read: no build may be published, and no source's tokens
cached, under the id or key of the old content.

Class 5: ``rebuild --keep`` from any working directory keeps every build a checkpoint needs; a
curriculum stage, an expert and the files packtrain itself uses never share a name.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import packtrain.pipeline.orchestrate.build
import packtrain.pipeline.encode.source_caches
import packtrain.pipeline.orchestrate.partition
from build_fixtures import make_project, rows, write_jsonl
from packtrain.pipeline.orchestrate.build import build, plan
from packtrain.pipeline.errors import InputsChanged
from packtrain.pipeline.pack.spill import SOURCES, source_key
from packtrain.core.configfile import load_config
from packtrain.core.contract import BUILD_ID, expert_dir, read_current
from packtrain.core.expert_names import check_expert_name
from packtrain.core.rundir import record_runs_dir, recorded_runs_dirs
from packtrain.core.errors import ContractError


def quiet(*_):
    pass


def builds(cache: Path, expert: str = "sql") -> list[str]:
    root = cache / expert
    return sorted(p.name for p in root.iterdir() if p.is_dir() and BUILD_ID.match(p.name)) if root.is_dir() else []


def source_caches(cache: Path, expert: str = "sql") -> list[str]:
    return sorted(p.name for p in (cache / expert / SOURCES).glob("*") if not p.name.startswith("."))


def documents(result) -> int:
    return result.report["train"]["documents"] + result.report["val"]["documents"]


def leftovers(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.rglob(".tmp-*"))


def edit_after_plan(monkeypatch, edit, times: int) -> list:
    """Run ``edit()`` right after each of the first ``times`` plans: between hashing and the lock."""
    plans = []
    real = packtrain.pipeline.orchestrate.build.plan

    def hooked(config, cache_dir, log=None):
        planned = real(config, cache_dir, log)
        plans.append(planned)
        if len(plans) <= times:
            edit()
        return planned

    monkeypatch.setattr(packtrain.pipeline.orchestrate.build, "plan", hooked)
    return plans


def edit_while_reading(monkeypatch, module, edit, times: int) -> list:
    """Run ``edit()`` after the first batch of each of the first ``times`` source reads."""
    reads = []
    real = module.iter_batches

    def hooked(*args, **kwargs):
        reads.append(1)
        for number, batch in enumerate(real(*args, **kwargs)):
            yield batch
            if number == 0 and len(reads) <= times:
                edit()

    monkeypatch.setattr(module, "iter_batches", hooked)
    return reads


@pytest.fixture
def project(tmp_path):
    return make_project(tmp_path, n_rows=40)


def config_of(project):
    return load_config("sql", project["configs"])


def test_source_edited_while_waiting_for_the_lock_is_built_under_its_new_id(project, monkeypatch):
    plans = edit_after_plan(monkeypatch, lambda: write_jsonl(project["data"], rows(45)), times=1)
    logs = []
    result = build(config_of(project), project["cache"], log=logs.append, progress=False)

    stale, fresh = plans[0], plans[1]
    assert stale.build_id != fresh.build_id
    assert result.build_id == fresh.build_id
    assert builds(project["cache"]) == [fresh.build_id]  # nothing under the old content's id
    assert read_current(project["cache"], "sql") == fresh.build_id
    assert source_caches(project["cache"]) == [source_key(fresh.inputs, 0)]
    assert source_key(stale.inputs, 0) != source_key(fresh.inputs, 0)
    said = [line for line in logs if "changed while the build of 'sql' waited" in line]
    assert len(said) == 1 and str(project["data"]) in said[0]
    assert documents(result) == 45
    # and a plan now agrees: up to date, not a stale build reported as current
    assert plan(config_of(project), project["cache"]).build_id == result.build_id


def test_source_that_keeps_changing_is_refused_and_nothing_is_published(project, monkeypatch):
    edits = []
    edit_after_plan(monkeypatch, lambda: (edits.append(1), write_jsonl(project["data"], rows(40 + len(edits)))),
                    times=2)
    with pytest.raises(InputsChanged) as e:
        build(config_of(project), project["cache"], log=quiet, progress=False)
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith(f"{project['data']} changed after the build id of 'sql'")
    assert message.endswith("build again once the file stops changing")
    assert builds(project["cache"]) == []
    assert read_current(project["cache"], "sql") is None
    assert source_caches(project["cache"]) == []


def test_source_edited_while_it_is_read_is_never_cached_under_the_old_key(project, monkeypatch):
    config = config_of(project)
    stale = plan(config, project["cache"])
    edits = []
    reads = edit_while_reading(monkeypatch, packtrain.pipeline.encode.source_caches,
                               lambda: (edits.append(1), write_jsonl(project["data"], rows(48 + len(edits)))), times=2)
    with pytest.raises(InputsChanged, match="sql.jsonl changed after the build id"):
        build(config, project["cache"], log=quiet, progress=False, planned=stale)
    assert len(reads) == 2  # planned again once, read again once, changed again: refused
    assert builds(project["cache"]) == []
    assert source_caches(project["cache"]) == []
    assert leftovers(project["cache"]) == []

    # once the file holds still, the build describes what is there
    result = build(config, project["cache"], log=quiet, progress=False)
    assert result.build_id == plan(config, project["cache"]).build_id != stale.build_id
    assert documents(result) == 50


def test_a_touch_is_not_a_change(project, monkeypatch):
    first = build(config_of(project), project["cache"], log=quiet, progress=False)
    shutil.rmtree(project["cache"] / "sql" / first.build_id)
    (project["cache"] / "sql" / "CURRENT").unlink()
    edit_after_plan(monkeypatch, lambda: project["data"].touch(), times=1)
    logs = []
    result = build(config_of(project), project["cache"], log=logs.append, progress=False)
    assert result.build_id == first.build_id
    assert not [line for line in logs if "changed while" in line or "changed after" in line]


def test_tokenizer_file_edited_after_hashing(project, monkeypatch):
    config_path = project["model"] / "tokenizer_config.json"

    def edit():  # a new value every time
        cfg = json.loads(config_path.read_text())
        cfg["model_max_length"] = cfg.get("model_max_length", 100) + 1
        config_path.write_text(json.dumps(cfg))

    plans = edit_after_plan(monkeypatch, edit, times=1)
    result = build(config_of(project), project["cache"], log=quiet, progress=False)
    assert plans[0].inputs["tokenizer"]["hash"] != plans[1].inputs["tokenizer"]["hash"]
    assert result.build_id == plans[1].build_id
    assert builds(project["cache"]) == [plans[1].build_id]
    assert source_caches(project["cache"]) == [source_key(plans[1].inputs, 0)]

    edit_after_plan(monkeypatch, edit, times=2)
    (project["cache"] / "sql" / "CURRENT").unlink()
    with pytest.raises(InputsChanged, match=r"tokenizer_config\.json changed after the build id"):
        build(config_of(project), project["cache"], log=quiet, progress=False)
    assert builds(project["cache"]) == [plans[1].build_id]  # the earlier build is untouched
    assert read_current(project["cache"], "sql") is None


def test_file_of_a_local_directory_edited_while_read(tmp_path, monkeypatch):
    project = make_project(tmp_path, n_rows=20)
    directory = project["data"].parent
    second = write_jsonl(directory / "z.jsonl", rows(20, start=100))
    config_file = project["configs"] / "sql.yaml"
    config_file.write_text(config_file.read_text().replace(f"name: {project['data']}", f"name: {directory}"))
    reads = edit_while_reading(monkeypatch, packtrain.pipeline.encode.source_caches, lambda: write_jsonl(second, rows(25, start=100)), times=1)
    result = build(config_of(project), project["cache"], log=quiet, progress=False)
    assert len(reads) == 2
    assert documents(result) == 45
    assert builds(project["cache"]) == [result.build_id]
    assert source_caches(project["cache"]) == [source_key(plan(config_of(project), project["cache"]).inputs, 0)]


def test_hub_cache_blob_replaced_after_hashing(tmp_path, hub_cache, monkeypatch):
    project = make_project(tmp_path, n_rows=5)
    config_file = project["configs"] / "sql.yaml"
    config_file.write_text(config_file.read_text().replace(f"name: {project['data']}",
                                                           "name: b-mc2/sql-create-context"))
    link = hub_cache.sql / "sql_create_context_v4.json"
    blob = link.resolve()

    def edit():  # one more row every time
        data = json.loads(blob.read_text())
        blob.write_text(json.dumps(data + data[:1]))

    plans = edit_after_plan(monkeypatch, edit, times=2)
    with pytest.raises(InputsChanged, match=r"sql_create_context_v4\.json changed after the build id"):
        build(config_of(project), project["cache"], log=quiet, progress=False)
    assert len(plans) == 2
    assert builds(project["cache"]) == [] and source_caches(project["cache"]) == []


def test_partitioned_part_is_not_kept_when_its_source_changed(project, monkeypatch):
    from packtrain.pipeline.orchestrate.partition import PARTS, pretokenize_part

    edit_while_reading(monkeypatch, packtrain.pipeline.encode.source_caches, lambda: write_jsonl(project["data"], rows(50)), times=1)
    with pytest.raises(InputsChanged):
        pretokenize_part(config_of(project), project["cache"], (0, 2), log=quiet)
    assert list((project["cache"] / "sql" / SOURCES / PARTS).rglob("stats.json")) == []
    assert leftovers(project["cache"]) == []


# ----------------------------------------------------------------------------------------------
# Class 5: retention and names. Runs are found through the absolute runs directories recorded in
# the cache; a stage is ``<expert>.<stage>``, a name no expert can have.

ROOT = Path(__file__).resolve().parents[1]


def cli(*args, cwd):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "packtrain.cli", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True)


def test_rebuild_from_another_directory_keeps_the_build_a_checkpoint_needs(tmp_path, monkeypatch):
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    home.mkdir(), elsewhere.mkdir()
    project = make_project(home, n_rows=40)
    monkeypatch.chdir(home)  # train.output_dir is the default, relative "runs"
    ids = []
    for n in (40, 41):
        write_jsonl(project["data"], rows(n))
        ids.append(build(config_of(project), project["cache"], log=quiet, progress=False).build_id)
    checkpoint = home / "runs" / "sql" / "run-1" / "checkpoint-2"  # taken on the first build
    checkpoint.mkdir(parents=True)
    (checkpoint / "state.json").write_text(json.dumps({"build_id": ids[0], "step": 2}))
    record_runs_dir(project["cache"], "sql", Path("runs") / "sql")  # what packtrain.trainer.run.train.run does
    assert recorded_runs_dirs(project["cache"], "sql") == [home / "runs" / "sql"]
    finished = home / "runs" / "sql" / "run-2"  # a finished run on the second build: needs nothing
    finished.mkdir()
    (finished / "run.json").write_text(json.dumps({"build_id": ids[1]}))
    (finished / "summary.json").write_text("{}")
    shown = cli("status", "sql", "--json", "--configs-dir", project["configs"], "--cache-dir", project["cache"],
                cwd=elsewhere)
    assert json.loads(shown.stdout)["last_run"] == "run-2"

    write_jsonl(project["data"], rows(42))
    done = cli("rebuild", "sql", "--keep", 1, "--configs-dir", project["configs"], "--cache-dir", project["cache"],
               cwd=elsewhere)
    assert done.returncode == 0, done.stderr
    line = json.loads(done.stdout)
    assert line["action"] == "rebuilt" and line["pruned"] == [ids[1]]
    assert builds(project["cache"]) == sorted([ids[0], line["new_build"]])  # the checkpoint can still resume


def test_the_trainer_records_where_its_runs_live(tmp_path, monkeypatch):
    from packtrain.trainer.run.train import run
    from trainer_fixtures import make_config, random_blocks, tiny_model_dir, write_build

    model = tiny_model_dir(tmp_path / "model")
    cache = tmp_path / "cache"
    write_build(cache, "sql", random_blocks(4, 32, 0), random_blocks(2, 32, 1), 32, model)
    (tmp_path / "home").mkdir()
    monkeypatch.chdir(tmp_path / "home")
    run_dir = run(make_config(model, Path("runs"), max_steps=1), cache)
    assert run_dir.absolute().parent == tmp_path / "home" / "runs" / "sql"
    assert recorded_runs_dirs(cache, "sql") == [tmp_path / "home" / "runs" / "sql"]


STAGES = """
stages:
  - name: v2
    sources: [{{name: {data}}}]
"""


def test_a_stage_and_an_expert_of_the_same_spelling_never_share_builds(tmp_path):
    project = make_project(tmp_path, n_rows=20)
    other = write_jsonl(tmp_path / "data" / "other.jsonl", rows(30, start=300))
    sql = project["configs"] / "sql.yaml"
    (project["configs"] / "sql-v2.yaml").write_text(sql.read_text().replace(str(project["data"]), str(other)))
    sql.write_text(sql.read_text() + STAGES.format(data=project["data"]))

    [stage] = load_config("sql", project["configs"]).stage_configs()
    expert = load_config("sql-v2", project["configs"])
    assert (stage.expert, expert.expert) == ("sql.v2", "sql-v2")
    built_expert = build(expert, project["cache"], log=quiet, progress=False)
    logs = []
    built_stage = build(stage, project["cache"], log=logs.append, progress=False)
    # cache/sql-v2 may be where an older packtrain built this stage: said once, never used or touched
    assert [line for line in logs if line.startswith("note: the curriculum stage")] == [
        f"note: the curriculum stage sql.v2 is built in {project['cache'] / 'sql.v2'} now; "
        f"{project['cache'] / 'sql-v2'} may hold its builds by an older packtrain (kept as they are; delete them "
        "when no run needs them, unless they are the expert sql-v2's)"]
    assert built_stage.path.parent == project["cache"] / "sql.v2"
    assert built_expert.path.parent == project["cache"] / "sql-v2"
    assert documents(built_stage) == 20 and documents(built_expert) == 30
    assert read_current(project["cache"], "sql.v2") == built_stage.build_id != built_expert.build_id
    assert read_current(project["cache"], "sql-v2") == built_expert.build_id


@pytest.mark.parametrize("name", ["sql.v2", "sql.", ".v2", "sql.v2.x", "sql.V2", "sql.a-b", "sql..v2"])
def test_the_stage_namespace_is_not_an_expert_name(tmp_path, name):
    with pytest.raises(ContractError, match="invalid expert name"):
        check_expert_name(name)
    with pytest.raises(ContractError, match="invalid expert name"):
        load_config(name, tmp_path)
    if name != "sql.v2":
        with pytest.raises(ContractError, match="invalid expert name"):
            expert_dir(tmp_path, name)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name, why", [("defaults", "configs/defaults.yaml is the base of every expert's config"),
                                       ("train-all", "runs/train-all/ holds the logs of `packtrain train-all`")])
def test_names_used_by_something_else_are_refused(tmp_path, name, why):
    project = make_project(tmp_path, n_rows=20, decided=False)  # nothing in the cache
    shutil.copy(project["configs"] / "sql.yaml", project["configs"] / f"{name}.yaml")
    done = cli("pretokenize", name, "--configs-dir", project["configs"], "--cache-dir", project["cache"], cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr == (f"error: invalid expert name {name!r}: it is reserved ({why}); "
                           f"rename configs/{name}.yaml to another name\n")
    assert not project["cache"].exists()


def test_resume_auto_of_a_stage_points_at_checkpoints_of_the_former_layout(tmp_path, caplog):
    import dataclasses

    from packtrain.trainer.run.train import run
    from trainer_fixtures import make_config, random_blocks, tiny_model_dir, write_build

    model = tiny_model_dir(tmp_path / "model")
    write_build(tmp_path / "cache", "sql.v2", random_blocks(4, 32, 0), random_blocks(2, 32, 1), 32, model)
    (tmp_path / "runs" / "sql-v2" / "old-run" / "checkpoint-3").mkdir(parents=True)
    config = dataclasses.replace(make_config(model, tmp_path / "runs", max_steps=1), expert="sql.v2")
    with caplog.at_level("WARNING"):
        run_dir = run(config, tmp_path / "cache", resume="auto")
    assert run_dir.parent == tmp_path / "runs" / "sql.v2"
    assert (tmp_path / "runs" / "sql-v2" / "old-run" / "checkpoint-3").is_dir()  # untouched
    assert [r.getMessage() for r in caplog.records if "before curriculum" in r.getMessage()] == [
        f"resume auto: {tmp_path / 'runs' / 'sql-v2'} has checkpoints made before curriculum stages were named "
        f"<expert>.<stage>; if they are this stage's, stop and move that directory to {tmp_path / 'runs' / 'sql.v2'} "
        "to resume them"]
