"""A refused run creates nothing: every check that can refuse (the model, its adapters,
``train.init_adapter``, a checkpoint's weights) runs before the run directory exists, so a refusal
leaves no run directory holding only train.log, no ``<run>-from-<step>`` fork, and no checkpoint
of the run it would have resumed discarded."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from packtrain.core.config import ConfigError
from packtrain.core.configfile import config_from_dict
from packtrain.core.inputs import InputError
from packtrain.trainer.run.checkpoint import CheckpointError
from packtrain.trainer.run.curriculum import train_expert
from packtrain.trainer.model.model import ModelError
from packtrain.trainer.run.run_checks import TrainError
from packtrain.trainer.run.train import run
from trainer_fixtures import make_config, random_blocks, tiny_model_dir, write_build


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("model"))


def tree(directory: Path) -> dict[str, bytes]:
    """Every file under ``directory``, by relative path, with its bytes."""
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("lora, message", [
    ({"r": 4}, r"was trained with other LoRA settings: lora.r 8 \(this run: 4\); resume with the checkpoint's "
               r"\(--set lora.r=8\), or start a new run, from its adapter with train.init_adapter$"),
    ({"target_modules": ["q_proj"]}, r"other LoRA settings: lora.target_modules 'all-linear' \(this run: \['q_proj'\]\); "
                                     r"resume with the checkpoint's \(--set lora.target_modules=\"all-linear\"\)"),
    ({"alpha": 32}, r"other LoRA settings: lora.alpha 16 \(this run: 32\); resume with the checkpoint's \(--set lora.alpha=16\)"),
    ({"method": "qlora", "r": 4}, r"other LoRA settings: lora.method 'lora' \(this run: 'qlora'\), lora.r 8 \(this run: 4\); "
                                  r"resume with the checkpoint's \(--set lora.method=\"lora\" --set lora.r=8\)"),
])
def test_a_refused_resume_creates_no_fork_and_discards_no_checkpoint(tmp_path, model_dir, lora, message):
    write_build(tmp_path / "cache", "sql", random_blocks(8, 32, 0), random_blocks(2, 32, 1), 32, model_dir)
    finished = run(make_config(model_dir, tmp_path / "runs", max_steps=2, save_steps=1, run_name="done"),
                   tmp_path / "cache")
    unfinished = finished.with_name("open")  # a run killed after its step-2 checkpoint
    unfinished.mkdir()
    for name in ("checkpoint-1", "checkpoint-2", "config.json", "run.json", "metrics.jsonl", "train.log"):
        (shutil.copytree if (finished / name).is_dir() else shutil.copy2)(finished / name, unfinished / name)
    before = tree(tmp_path / "runs")

    for checkpoint in (finished / "checkpoint-1", finished / "checkpoint-1", unfinished / "checkpoint-1"):
        with pytest.raises(CheckpointError, match=message) as refused:
            run(make_config(model_dir, tmp_path / "runs", max_steps=4, lora=lora), tmp_path / "cache",
                resume=str(checkpoint))
        assert "\n" not in str(refused.value)

    assert sorted(p.name for p in (tmp_path / "runs" / "sql").iterdir()) == ["done", "open"]  # no done-from-1
    assert tree(tmp_path / "runs") == before  # open's checkpoint-2 is still there, nothing appended


def broken_model(model_dir: Path, directory: Path) -> Path:
    shutil.copytree(model_dir, directory)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "model_type": "no-such-model"}))
    return directory


def test_an_unknown_model_type_creates_no_run_directory(tmp_path, model_dir):
    write_build(tmp_path / "cache", "sql", random_blocks(8, 32, 0), [], 32, model_dir)
    config = make_config(broken_model(model_dir, tmp_path / "broken"), tmp_path / "runs")
    with pytest.raises(InputError, match=r"broken/config.json cannot be read as a transformers config.json \(ValueError: "
                       "The checkpoint you are trying to load has model type `no-such-model`"):
        run(config, tmp_path / "cache")
    assert not (tmp_path / "runs" / "sql").exists()


def test_a_missing_init_adapter_creates_no_run_directory(tmp_path, model_dir):
    write_build(tmp_path / "cache", "sql", random_blocks(8, 32, 0), [], 32, model_dir)
    config = make_config(model_dir, tmp_path / "runs", init_adapter=str(tmp_path / "nowhere"))
    with pytest.raises(TrainError, match=r"^train.init_adapter: adapter weights .*nowhere.* do not exist: set "
                       r"train.init_adapter to a directory holding adapter_model.safetensors \(a finished run's adapter/"):
        run(config, tmp_path / "cache")
    assert not (tmp_path / "runs" / "sql").exists()


def test_a_refused_stage_creates_no_run_directory(tmp_path, model_dir):
    for stage in ("first", "second"):
        write_build(tmp_path / "cache", f"sql.{stage}", random_blocks(8, 32, 0), [], 32, model_dir)
    config = make_config(broken_model(model_dir, tmp_path / "broken"), tmp_path / "runs").to_dict()
    config["stages"] = [{"name": stage, "sources": [{"name": "bundled"}]} for stage in ("first", "second")]
    with pytest.raises(TrainError, match="^sql.first: .*broken/config.json cannot be read as a transformers config.json"):
        train_expert(config_from_dict(config), tmp_path / "cache")
    assert not (tmp_path / "runs").exists()


def test_the_held_log_lines_open_the_run_s_train_log(tmp_path, model_dir):
    """The lines logged while the run was set up (before its directory existed) are in its train.log."""
    write_build(tmp_path / "cache", "sql", random_blocks(8, 32, 0), [], 32, model_dir)
    run_dir = run(make_config(model_dir, tmp_path / "runs", max_steps=1), tmp_path / "cache")
    log = (run_dir / "train.log").read_text().splitlines()
    assert "INFO torch threads: " in log[0] and "INFO precision: cpu: training in fp32" in log[1]
    assert any("INFO attention: " in line for line in log[:4])
    assert any(f"INFO run {run_dir}: build " in line for line in log)


def test_an_init_adapter_of_another_rank_is_one_line(tmp_path, model_dir):
    write_build(tmp_path / "cache", "sql", random_blocks(8, 32, 0), [], 32, model_dir)
    done = run(make_config(model_dir, tmp_path / "runs", max_steps=1, run_name="done"), tmp_path / "cache")
    config = make_config(model_dir, tmp_path / "runs", max_steps=1, lora={"r": 4}, init_adapter=str(done / "adapter"))
    with pytest.raises(TrainError, match=r"^train.init_adapter: adapter weights .* do not fit this model \(28 tensors of "
                       r"another shape, first base_model.model.model.layers.0.mlp.down_proj.lora_A.weight: \[8, 128\] "
                       r"saved, \[4, 128\] here\)"):
        run(config, tmp_path / "cache")
    assert sorted(p.name for p in (tmp_path / "runs" / "sql").iterdir()) == ["done"]


@pytest.mark.parametrize("targets, message", [
    (["q_proj", "v_prj"], r"^lora.target_modules: 'v_prj' is no module of the model; its linear layers are down_proj, "
                          r"gate_proj, k_proj, o_proj, q_proj, up_proj, v_proj \(or use \"all-linear\"\)$"),
    (["nothing", "else"], r"^lora.target_modules: 'nothing', 'else' are no module of the model; its linear layers"),
    (["q_proj", "mlp"], r"^lora.target_modules: 'mlp' \(Qwen2MLP\) is not a linear or embedding layer; its linear"),
])
def test_target_modules_that_name_no_layer_are_one_line(tmp_path, model_dir, targets, message):
    """peft refuses a list only when nothing in it matches (with a traceback), and adapts what it can
    of the rest: a misspelt name beside a good one trained fewer adapters without a word."""
    write_build(tmp_path / "cache", "sql", random_blocks(8, 32, 0), [], 32, model_dir)
    with pytest.raises(ConfigError, match=message):
        run(make_config(model_dir, tmp_path / "runs", lora={"target_modules": targets}), tmp_path / "cache")
    assert not (tmp_path / "runs" / "sql").exists()


def test_target_modules_as_a_bare_name_is_refused_when_the_config_loads(tmp_path, model_dir):
    with pytest.raises(ConfigError, match=r"lora.target_modules: 'q_proj' is neither \"all-linear\" nor a list \(peft "
                       r"would read it as a regular expression over whole module paths\); write \[q_proj\]"):
        make_config(model_dir, tmp_path / "runs", lora={"target_modules": "q_proj"})


def test_a_model_without_sdpa_attention_is_told_to_use_eager(tmp_path, model_dir):
    """Gemma 2 has no SDPA path in transformers 5: the refusal names model.use_sdpa, not a damaged model."""
    from transformers import Gemma2Config

    gemma = tmp_path / "gemma2"
    Gemma2Config(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16).save_pretrained(gemma)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy2(model_dir / name, gemma / name)
    write_build(tmp_path / "cache", "sql", random_blocks(8, 32, 0), [], 32, gemma)
    with pytest.raises(ModelError, match=r"^model .*gemma2 \(Gemma2ForCausalLM\) has no SDPA attention in transformers "
                       r"[0-9.]+: set model.use_sdpa: false \(eager attention"):
        run(make_config(gemma, tmp_path / "runs"), tmp_path / "cache")
    assert not (tmp_path / "runs" / "sql").exists()
