"""End-to-end runs of packtrain.trainer.run.train.run on tiny hand-written builds (CPU, a 2-layer Qwen2)."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from packtrain.core.config_train import ModelConfig
from packtrain.trainer.model.model import ModelError, model_source
from packtrain.trainer.run.run_checks import TrainError
from packtrain.trainer.run.train import run
from trainer_fixtures import make_config, random_blocks, tiny_model_dir, write_build, write_tokenizer

TRAIN_KEYS = {"step", "epoch", "loss", "lr", "grad_norm", "tok_s", "sup_tok_s", "mfu", "data_wait", "mem/peak_gib",
              "step_s"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("model"))


def records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def train_records(run_dir):
    return [r for r in records(run_dir) if "loss" in r and "skipped" not in r]


def test_end_to_end_writes_adapter_metrics_config_and_summary(tmp_path, model_dir):
    write_build(tmp_path / "cache", "sql", random_blocks(10, 32, 0), random_blocks(3, 32, 1), 32, model_dir,
                rows_per_shard=4)
    config = make_config(model_dir, tmp_path / "runs", max_steps=4, eval_steps=2, save_steps=2, save_total_limit=1,
                         peak_tflops=0.1, merge_adapter=True)
    run_dir = run(config, tmp_path / "cache")

    assert run_dir.parent == tmp_path / "runs" / "sql"
    assert json.loads((run_dir / "config.json").read_text()) == config.to_dict()
    lines = train_records(run_dir)
    assert [r["step"] for r in lines] == [1, 2, 3, 4]
    assert all(set(r) == TRAIN_KEYS for r in lines)
    assert all(math.isfinite(r["loss"]) and r["tok_s"] > 0 and 0 <= r["data_wait"] <= 1 and r["mfu"] > 0
               for r in lines)
    evals = [r for r in records(run_dir) if "eval/loss" in r]
    assert [e["step"] for e in evals] == [0, 2, 4] and all(e["eval/ppl"] > 1 for e in evals)  # 0: before training
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["eval/loss"] == evals[-1]["eval/loss"]
    assert (summary["eval/loss_before"], summary["eval/loss_after"]) == (evals[0]["eval/loss"], evals[-1]["eval/loss"])
    assert "eval loss before training" in (run_dir / "train.log").read_text()
    assert sorted(p.name for p in run_dir.glob("checkpoint-*")) == ["checkpoint-4"]  # save_total_limit 1
    assert json.loads((run_dir / "checkpoint-4" / "config.json").read_text()) == config.to_dict()

    adapter = run_dir / "adapter"
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json", "packtrain_config.json"} <= {
        p.name for p in adapter.iterdir()}
    saved = load_file(adapter / "adapter_model.safetensors")
    assert any("lora_B" in k and v.abs().sum() > 0 for k, v in saved.items())  # it trained
    base = AutoModelForCausalLM.from_pretrained(model_dir)
    loaded = PeftModel.from_pretrained(base, adapter)
    state = {k: v for k, v in loaded.state_dict().items() if "lora_" in k}
    assert len(state) == len(saved)
    ids = torch.randint(4, 256, (1, 16))
    merged = AutoModelForCausalLM.from_pretrained(run_dir / "merged")
    with torch.no_grad():
        torch.testing.assert_close(merged(ids).logits, loaded(input_ids=ids).logits, atol=1e-4, rtol=1e-4)


def test_loss_falls_on_a_memorization_set(tmp_path, model_dir):
    rng = np.random.default_rng(0)
    pool = [(rng.integers(4, 256, 30).tolist(), 4) for _ in range(4)]
    blocks = [[pool[i % 4], pool[(i + 1) % 4]] for i in range(8)]
    write_build(tmp_path / "cache", "sql", blocks, [], 64, model_dir)
    config = make_config(model_dir, tmp_path / "runs", max_steps=60, per_device_train_batch_size=8,
                         learning_rate=1e-2, logging_steps=5)
    run_dir = run(config, tmp_path / "cache")
    losses = [r["loss"] for r in train_records(run_dir)]
    assert len(losses) == 12
    assert losses[-1] < 0.5 * losses[0], losses
    assert losses[-1] < 2.0, losses
    assert "evaluation is skipped" in (run_dir / "train.log").read_text()  # no val blocks


def test_qlora_nf4_on_cpu_with_random_init_base(tmp_path):
    model_dir = tiny_model_dir(tmp_path / "model", weights=False)
    write_build(tmp_path / "cache", "sql", random_blocks(6, 32, 0), [], 32, model_dir)
    config = make_config(model_dir, tmp_path / "runs", max_steps=3, lora={"method": "qlora"}, optim="adamw_bnb_8bit",
                         save_steps=2)
    run_dir = run(config, tmp_path / "cache")
    # the 8-bit optimizer state round-trips through a weights_only checkpoint
    longer = make_config(model_dir, tmp_path / "runs", max_steps=4, lora={"method": "qlora"}, optim="adamw_bnb_8bit")
    resumed = run(longer, tmp_path / "cache", resume=str(run_dir / "checkpoint-3"))
    assert resumed == run_dir.with_name(f"{run_dir.name}-from-3")  # a finished run continues in a new one
    run_dir = resumed
    log = (run_dir / "train.log").read_text()
    assert "RANDOM INIT" in log
    assert "qlora: 14 linear layers quantized to NF4" in log  # 7 per layer; lm_head stays full precision
    assert [r["step"] for r in train_records(run_dir)] == [1, 2, 3, 4]
    assert all(math.isfinite(r["loss"]) for r in train_records(run_dir))
    assert json.loads((run_dir / "run.json").read_text())["random_init"] is True
    assert (run_dir / "adapter" / "adapter_model.safetensors").is_file()
    assert (run_dir / "adapter" / "adapter_config.json").is_file()


def test_two_persistent_workers_end_to_end(tmp_path, model_dir):
    write_build(tmp_path / "cache", "sql", random_blocks(6, 32, 0), random_blocks(2, 32, 1), 32, model_dir,
                rows_per_shard=2)
    config = make_config(model_dir, tmp_path / "runs", max_steps=5, dataloader_num_workers=2,
                         dataloader_prefetch_factor=2, dataloader_persistent_workers=True, eval_steps=5)
    run_dir = run(config, tmp_path / "cache")  # 3 batches per epoch: crosses an epoch boundary
    lines = train_records(run_dir)
    assert [r["epoch"] for r in lines] == pytest.approx([1 / 3, 2 / 3, 1, 4 / 3, 5 / 3], abs=1e-12)  # HF's fraction


def test_tokenizer_mismatch_is_refused_naming_the_file(tmp_path, model_dir):
    other = write_tokenizer(tmp_path / "other-tok", extra="a different chat template")
    write_build(tmp_path / "cache", "sql", random_blocks(4, 32, 0), [], 32, other)
    config = make_config(model_dir, tmp_path / "runs")
    with pytest.raises(TrainError) as err:
        run(config, tmp_path / "cache")
    message = str(err.value)
    assert "tokenizer_config.json (build " in message and "tokenizer.json (build " not in message
    assert "`packtrain pretokenize sql --model " in message and str(other) in message
    assert not (tmp_path / "runs").exists()  # refused before anything was written


def test_missing_build_says_how_to_make_one(tmp_path, model_dir):
    with pytest.raises(Exception, match="`packtrain pretokenize sql`"):
        run(make_config(model_dir, tmp_path / "runs"), tmp_path / "cache")


def test_model_from_the_hub_cache_offline(tmp_path, model_dir, monkeypatch):
    hub = tmp_path / "hub"
    repo = hub / "models--org--tiny"
    snapshot = repo / "snapshots" / ("c" * 40)
    shutil.copytree(model_dir, snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("c" * 40)
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    source = model_source(ModelConfig(name="org/tiny"))
    assert source.directory == snapshot and source.has_weights
    with pytest.raises(ModelError, match="huggingface-cli download org/absent"):
        model_source(ModelConfig(name="org/absent"))
    with pytest.raises(ModelError, match="does not exist"):
        model_source(ModelConfig(name=str(tmp_path / "no" / "such" / "dir")))


def test_a_hub_model_without_refs_resolves_for_training_as_for_the_build(hf_home):
    """Downloaded by commit (no refs/main): the build finds it, so the trainer must too."""
    from conftest import write_hub_repo
    from packtrain.core.config import ModelConfig
    from packtrain.core.contract import BUNDLED_MODEL_DIR
    from packtrain.core.resolve import resolve_tokenizer_dir
    from packtrain.trainer.model.model import model_source

    files = {name: (BUNDLED_MODEL_DIR / name).read_bytes() for name in ("config.json", "tokenizer.json", "tokenizer_config.json")}
    snapshot = write_hub_repo(hf_home / "hub", "model", "org/tiny", "0123456789" * 4, files, refs=())
    config = ModelConfig(name="org/tiny")
    assert resolve_tokenizer_dir(config) == snapshot
    assert model_source(config).directory == snapshot
    assert model_source(ModelConfig(name="org/tiny", revision="01234567")).directory == snapshot
