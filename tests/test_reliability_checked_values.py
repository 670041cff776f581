"""Issue 46 (round three), items 3 and 4 in part: the last unchecked values. A build under
``cache/<expert>/`` that is another expert's is refused by ``verify`` as by ``train`` (one check,
packtrain/core/contract.py ``check_build_expert``). The sampling options of ``generate``/``chat``:
tests/test_talk.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from packtrain.core.contract import read_current, write_current
from build_fixtures import make_project
from test_reliability_runs_inputs import assert_one_line_error, run_cli


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict:
    """A real build of the tiny project's expert sql (block_size 128); configs/json.yaml is the same expert
    under another name (no build)."""
    project = make_project(tmp_path_factory.mktemp("checked"))
    configs = project["configs"]
    (configs / "json.yaml").write_text((configs / "sql.yaml").read_text())
    done = run_cli("pretokenize", "sql", "--configs-dir", configs, "--cache-dir", project["cache"], "--no-progress")
    assert done.returncode == 0, done.stderr
    return project


def test_verify_refuses_another_experts_build_as_train_does(built, tmp_path):
    cache = tmp_path / "cache"
    shutil.copytree(built["cache"], cache)
    build_id = read_current(cache, "sql")
    copy = cache / "json" / build_id
    shutil.copytree(cache / "sql" / build_id, copy)  # sql's build placed under cache/json/
    write_current(cache, "json", build_id)
    said = (f"error: build {copy} is a build of expert 'sql', not 'json' (its manifest.json says so): it belongs in "
            f"{cache / 'sql'}/; build json's own with `packtrain pretokenize json --cache-dir {cache}`")
    configs = f"--configs-dir {built['configs']} "  # the hint repeats the options each command was given
    verified = run_cli("verify", "json", "--cache-dir", cache)
    assert assert_one_line_error(verified) == said
    assert "checksums match" not in verified.stdout + verified.stderr
    trained = run_cli("train", "json", "--configs-dir", built["configs"], "--cache-dir", cache)  # before torch
    assert assert_one_line_error(trained) == said.replace("json --cache-dir", f"json {configs}--cache-dir")
    for command in ("inspect", "plot"):  # every command that reads an expert's build
        assert assert_one_line_error(run_cli(command, "json", "--cache-dir", cache)) == said
    assert not (copy / "plots").exists()
    assert run_cli("verify", "sql", "--cache-dir", cache).returncode == 0  # the build itself is good


# ----------------------------------------------------------------------------------------------
# train reads the build its config describes


def test_train_refuses_a_build_made_with_another_value_of_a_build_field(built):
    build_id = read_current(built["cache"], "sql")
    build_dir = built["cache"] / "sql" / build_id
    common = ["--configs-dir", built["configs"], "--cache-dir", built["cache"]]
    refused = run_cli("train", "sql", *common, "--set", "pack.block_size=64")  # refused before torch is imported
    assert assert_one_line_error(refused) == (
        f"error: build {build_id} of sql ({build_dir}), the one train reads, was made with other build settings than "
        "this config: pack.block_size 64 in the config, 128 in the build; build the config first with the same "
        f"options as this train (`packtrain pretokenize sql --configs-dir {built['configs']} --cache-dir {built['cache']} "
        "--set pack.block_size=64`; `make train` builds first), "
        "or train without the settings that differ")
    several = run_cli("train", "sql", *common, "--set", "build.dedup=none", "--set", "format.answer=\"{answer};\"",
                      "--set", f"sources=[{{name: {built['data']}, max_rows: 10}}]")  # any field that decides what the build holds
    assert assert_one_line_error(several, 'format.answer "{answer};" in the config, "{answer}" in the build',
                                 'build.dedup "none" in the config, "exact" in the build',
                                 "sources[0].max_rows 10 in the config, null in the build",
                                 "--set build.dedup=none --set 'format.answer=\"{answer};\"' --set 'sources=[{name: ")
    special = run_cli("train", "sql", *common, "--set", "build.special_tokens_in_text=special")  # ids of the data
    assert assert_one_line_error(special, 'build.special_tokens_in_text "special" in the config, "text" in the build')
    other = run_cli("train", "sql", *common, "--dataset", built["data"].parent / "other.jsonl")
    assert assert_one_line_error(other, f"sources[0].name \"{built['data'].parent / 'other.jsonl'}\" in the config, "
                                        f"\"{built['data']}\" in the build")


def test_what_changes_no_block_is_not_compared_and_a_build_id_given_is_used_saying_so(built):
    from packtrain.core.build_match import build_differences, check_build_matches
    from packtrain.core.configfile import load_config, load_for_machine

    build_id = read_current(built["cache"], "sql")
    build_dir = built["cache"] / "sql" / build_id
    made = __import__("json").loads((build_dir / "config.json").read_text())
    for overrides in ({}, {"build.num_proc": 2, "build.batch_rows": 7, "build.check_documents": 0,
                           "build.fast_encoder": False, "build.line_cache": False, "pack.shard_size_mb": 1,
                           "train.learning_rate": 0.5, "model.name": "elsewhere"}):
        assert build_differences(load_config("sql", built["configs"], overrides).to_dict(), made) == []
    assert build_differences(load_for_machine("sql", built["configs"], {})[0].to_dict(), made) == []
    said: list[str] = []
    check_build_matches(load_config("sql", built["configs"], {"pack.block_size": 64}), build_dir, build_id, said.append)
    assert said == [f"training on build {build_id} as --build-id asks, made with other build settings than the "
                    "config's: pack.block_size 64 in the config, 128 in the build"]
    named = run_cli("train", "sql", "--configs-dir", built["configs"], "--cache-dir", built["cache"], "--build-id",
                    build_id, "--set", "pack.block_size=64")  # goes on, to the model (the project has a tokenizer only)
    assert named.stderr.startswith(f"warning: {said[0]}\nerror: {built['model']} has no config.json")
