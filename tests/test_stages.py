"""Curriculum stages: each stage its own build and run, each starting from the previous adapter."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from packtrain.core.contract import read_current
from packtrain.trainer.run.run_checks import TrainError
from packtrain.trainer.run.train import run
from build_fixtures import bundled_cache
from inprocess_cli import QUICK_END, cli
from trainer_fixtures import make_config, random_blocks, tiny_model_dir, write_build

ROOT = Path(__file__).resolve().parents[1]


def adapter(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(run_dir / "adapter" / "adapter_model.safetensors")


def test_init_adapter_starts_from_those_weights(tmp_path):
    model_dir = tiny_model_dir(tmp_path / "model")
    write_build(tmp_path / "cache", "sql", random_blocks(8, 32, 0), [], 32, model_dir)
    first = run(make_config(model_dir, tmp_path / "runs", max_steps=3, run_name="first"), tmp_path / "cache")
    trained = adapter(first)
    assert max(t.abs().max().item() for name, t in trained.items() if "lora_B" in name) > 1e-4  # B left zero
    # a near-zero learning rate: what comes out is what went in
    config = make_config(model_dir, tmp_path / "runs", max_steps=1, learning_rate=1e-12, run_name="second",
                         init_adapter=str(first / "adapter"))
    second = adapter(run(config, tmp_path / "cache"))
    assert all(torch.allclose(second[name], trained[name], atol=1e-7) for name in trained)
    config = make_config(model_dir, tmp_path / "runs", max_steps=1, run_name="third",
                         init_adapter=str(tmp_path / "nowhere"))
    with pytest.raises(TrainError, match=r"train.init_adapter: adapter weights .*nowhere.* do not exist: set "
                                         r"train.init_adapter to a directory"):
        run(config, tmp_path / "cache")


def curriculum(tmp_path: Path, stages_yaml: str) -> list:
    """configs/ with sql.yaml + ``stages_yaml``, and the CLI arguments for a quick CPU run of it."""
    configs = tmp_path / "configs"
    shutil.copytree(ROOT / "configs", configs)
    (configs / "sql.yaml").write_text((configs / "sql.yaml").read_text() + stages_yaml)
    return ["--configs-dir", configs, "--cache-dir", bundled_cache(tmp_path / "cache"),
            "--set", f"train.output_dir={tmp_path / 'runs'}",
            "--set", "train.per_device_train_batch_size=1", "--set", "train.max_eval_batches=1",
            "--set", "train.dataloader_num_workers=0", "--num-proc", "1", *QUICK_END]


def test_a_curriculum_builds_and_trains_each_stage_from_the_last(hf_home, tmp_path):
    common = curriculum(tmp_path, """
stages:
  - name: basics
    sources: [{name: bundled, max_rows: 300}]
  - name: all
    sources: [{name: bundled}]
    max_steps: 2
""")

    built = cli("pretokenize", "sql", *common)
    assert built.returncode == 0, built.stderr
    lines = [json.loads(line) for line in built.stdout.splitlines() if line.startswith("{")]
    assert [line["expert"] for line in lines] == ["sql.basics", "sql.all"]
    assert read_current(tmp_path / "cache", "sql.basics") and read_current(tmp_path / "cache", "sql.all")

    trained = cli("train", "sql", *common, "--set", "train.max_steps=1")
    assert trained.returncode == 0, trained.stderr[-3000:]
    runs = [json.loads(line) for line in trained.stdout.splitlines() if line.startswith("{")]
    assert [r["expert"] for r in runs] == ["sql.basics", "sql.all"]
    log = (Path(runs[1]["run_dir"]) / "train.log").read_text()
    assert f"adapter weights initialised from {runs[0]['adapter']}" in log
    assert json.loads((Path(runs[1]["run_dir"]) / "summary.json").read_text())["steps"] == 2  # the stage's max_steps
    assert json.loads((Path(runs[0]["run_dir"]) / "summary.json").read_text())["steps"] == 1


def test_curriculum_command_line_rules(hf_home, tmp_path):
    common = curriculum(tmp_path, """
stages:
  - name: basics
    sources: [{name: bundled, max_rows: 200}]
    max_steps: 5000
  - name: all
    sources: [{name: bundled, max_rows: 300}]
""")

    refused = cli("train", "sql", *common, "--resume", tmp_path / "runs" / "sql.basics")
    assert refused.returncode == 2 and "use --resume auto" in refused.stderr
    assert cli("pretokenize", "sql", *common).returncode == 0
    trained = cli("train", "sql", *common, "--max-steps", 1)  # beats the stage's max_steps: 5000
    assert trained.returncode == 0, trained.stderr[-2000:]
    runs = [json.loads(line) for line in trained.stdout.splitlines() if line.startswith("{")]
    assert [json.loads((Path(r["run_dir"]) / "summary.json").read_text())["steps"] for r in runs] == [1, 1]


def test_stage_names_are_checked():
    from packtrain.core.config import ConfigError
    from packtrain.core.configfile import config_from_dict

    with pytest.raises(ConfigError) as err:
        config_from_dict({"expert": "sql", "sources": [], "stages": [
            {"name": "", "sources": [{"name": "bundled"}]}, {"name": "A-b", "sources": [{"name": "bundled"}]}]})
    assert "stages[0].name: ''" in str(err.value) and "stages[1].name: 'A-b'" in str(err.value)


def one_stage_curriculum(model_dir: Path, runs: Path):
    """``sql`` with ``stages:`` holding one stage (``sql.only``), for the tiny model."""
    from packtrain.core.configfile import config_from_dict

    config = make_config(model_dir, runs, max_steps=2).to_dict()
    config["stages"] = [{"name": "only", "sources": [{"name": "bundled"}]}]
    return config_from_dict(config)


def test_resume_auto_of_a_finished_one_stage_curriculum_skips_the_stage(tmp_path):
    """One stage is still a curriculum: --resume auto skips it once finished (it trained it again)."""
    from packtrain.trainer.run.curriculum import train_expert

    model_dir = tiny_model_dir(tmp_path / "model")
    write_build(tmp_path / "cache", "sql.only", random_blocks(6, 32, 0), [], 32, model_dir)
    [first] = train_expert(one_stage_curriculum(model_dir, tmp_path / "runs"), tmp_path / "cache")
    said = []
    again = train_expert(one_stage_curriculum(model_dir, tmp_path / "runs"), tmp_path / "cache", resume="auto",
                         say=said.append)
    assert again == [first]
    assert said == [f"resume auto: stage sql.only finished in {first}; going on from its adapter"]
    assert [p.name for p in (tmp_path / "runs" / "sql.only").iterdir()] == [first.name]


@pytest.mark.parametrize("kwargs, message", [
    ({"resume": "PATH"}, "a curriculum resumes each stage from its own runs; use --resume auto"),
    ({"build_id": "abc"}, "--build-id names one build, and a curriculum has one build per stage"),
])
def test_a_one_stage_curriculum_refuses_what_a_curriculum_refuses(tmp_path, kwargs, message):
    """One stage is a curriculum: --resume PATH (it forked <run>-from-N) and --build-id are refused
    before anything is created, as for two stages (issue 23)."""
    from packtrain.core.config import ConfigError
    from packtrain.trainer.run.curriculum import train_expert

    model_dir = tiny_model_dir(tmp_path / "model")
    write_build(tmp_path / "cache", "sql.only", random_blocks(6, 32, 0), [], 32, model_dir)
    [first] = train_expert(one_stage_curriculum(model_dir, tmp_path / "runs"), tmp_path / "cache")
    kwargs = {k: str(first / "checkpoint-2") if v == "PATH" else v for k, v in kwargs.items()}
    with pytest.raises(ConfigError, match=re.escape(message)):
        train_expert(one_stage_curriculum(model_dir, tmp_path / "runs"), tmp_path / "cache", **kwargs)
    assert [p.name for p in (tmp_path / "runs" / "sql.only").iterdir()] == [first.name]
