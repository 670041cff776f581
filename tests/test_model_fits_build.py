"""A build the model cannot read is refused before the run directory exists (attack 52, 2026-12-06;
trainer/run/run_checks.py ``check_build_fits_model``): token ids past the model's embeddings, position ids past
its context. Before, each was an ``IndexError: index out of range in self`` traceback from the first forward,
after the run directory was made."""

from __future__ import annotations

from pathlib import Path

import pytest

from packtrain.trainer.run.run_checks import TrainError
from packtrain.trainer.run.train import run
from trainer_fixtures import make_config, random_blocks, tiny_model_dir, write_build, write_tokenizer


def gpt2_dir(directory: Path, positions: int) -> Path:
    """A tiny GPT-2 (learned position embeddings: ``n_positions`` of them) with the fixtures' tokenizer."""
    from transformers import AutoModelForCausalLM, GPT2Config

    config = GPT2Config(vocab_size=256, n_positions=positions, n_embd=32, n_layer=1, n_head=2, bos_token_id=0,
                        eos_token_id=0, pad_token_id=3)
    AutoModelForCausalLM.from_config(config).save_pretrained(directory)
    return write_tokenizer(directory)


def test_token_ids_past_the_models_embeddings_are_refused(tmp_path):
    model_dir = tiny_model_dir(tmp_path / "model")  # 256 embeddings
    build_id = write_build(tmp_path / "cache", "sql", random_blocks(4, 32, 0, vocab_size=400), random_blocks(2, 32, 1),
                           32, model_dir)  # the manifest says 256 tokens, the shards hold ids up to 398
    with pytest.raises(TrainError) as refused:
        run(make_config(model_dir, tmp_path / "runs"), tmp_path / "cache")
    assert str(refused.value) == (
        f"build {build_id} holds token id 398 ({tmp_path / 'cache' / 'sql' / build_id / 'train-00000.arrow'}), and "
        f"model {model_dir} has 256 token embeddings (ids 0..255): this model cannot read these shards; rebuild with "
        f"the model's tokenizer (`packtrain pretokenize sql --model {model_dir}`), or train with the model the build "
        "was made for")
    assert not (tmp_path / "runs").exists()


def test_position_ids_past_the_models_context_are_refused_and_windows_train(tmp_path):
    model_dir = gpt2_dir(tmp_path / "gpt2", positions=16)
    build_id = write_build(tmp_path / "cache", "sql", random_blocks(6, 32, 0), random_blocks(2, 32, 1), 32, model_dir)
    with pytest.raises(TrainError) as refused:
        run(make_config(model_dir, tmp_path / "runs"), tmp_path / "cache")
    assert str(refused.value) == (
        f"build {build_id} trains sequences whose position ids run to 28 (a document or a block's padding of 29 "
        f"tokens, in sequences of 32), past model {model_dir}'s context of 16 positions (max_position_embeddings); "
        "train on windows of at most 16 tokens (--set train.max_seq_length=16), or rebuild with pack.block_size 16")
    assert not (tmp_path / "runs").exists()
    run_dir = run(make_config(model_dir, tmp_path / "runs", max_seq_length=16), tmp_path / "cache")  # the fix said
    assert (run_dir / "adapter" / "adapter_model.safetensors").is_file()


def test_a_block_longer_than_the_context_trains_where_every_document_fits(tmp_path):
    model_dir = gpt2_dir(tmp_path / "gpt2", positions=16)
    docs = [[(list(range(4, 18)), 3), (list(range(20, 34)), 5)]]  # 14 + 14 tokens and 4 of padding in 32
    write_build(tmp_path / "cache", "sql", docs * 4, docs, 32, model_dir)
    run_dir = run(make_config(model_dir, tmp_path / "runs"), tmp_path / "cache")
    assert (run_dir / "adapter" / "adapter_model.safetensors").is_file()


def test_rotary_positions_past_max_position_embeddings_train(tmp_path):
    """A rotary model (Llama, SmolLM2, Qwen) computes its positions for any id: its config's
    max_position_embeddings is no table's end, and a build past it trains (the embedded model's tiny stand-in
    says 64 and trains 512-token windows). Only a learned position table refuses."""
    import json

    from packtrain.trainer.model.model import position_table

    model_dir = tiny_model_dir(tmp_path / "model", arch="llama")
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 16}))
    write_build(tmp_path / "cache", "sql", random_blocks(6, 32, 0), random_blocks(2, 32, 1), 32, model_dir)
    run_dir = run(make_config(model_dir, tmp_path / "runs"), tmp_path / "cache")
    assert (run_dir / "adapter" / "adapter_model.safetensors").is_file()
    from transformers import AutoModelForCausalLM

    assert position_table(AutoModelForCausalLM.from_pretrained(model_dir)) is None
    assert position_table(AutoModelForCausalLM.from_pretrained(gpt2_dir(tmp_path / "gpt2", positions=16))) == 16


def test_rotary_positions_computed_once_end_where_their_table_does(tmp_path):
    """GPT-J and CodeGen are rotary, but compute their sin/cos once for ``n_positions`` rows (a buffer named
    ``embed_positions``) and index it by position id; CTRL's sinusoids the same (``pos_encoding``): position ids
    past them were an ``IndexError`` traceback from the first forward, the check taking them for unbounded.
    Rotary positions computed per batch (GPT-NeoX) and ALiBi (BLOOM) take any id."""
    from transformers import (AutoModelForCausalLM, BloomConfig, CodeGenConfig, CTRLConfig, GPTJConfig,
                              GPTNeoXConfig)

    from packtrain.trainer.model.model import position_table

    small = {"vocab_size": 256, "n_embd": 32, "n_layer": 1, "n_head": 2, "n_positions": 16}
    configs = {"gptj": GPTJConfig(**small, rotary_dim=8), "codegen": CodeGenConfig(**small, rotary_dim=8),
               "ctrl": CTRLConfig(**small, dff=64), "bloom": BloomConfig(vocab_size=256, hidden_size=32, n_layer=1, n_head=2),
               "gpt_neox": GPTNeoXConfig(vocab_size=256, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                         intermediate_size=64, max_position_embeddings=16)}
    tables = {name: position_table(AutoModelForCausalLM.from_config(config)) for name, config in configs.items()}
    assert tables == {"gptj": 16, "codegen": 16, "ctrl": 16, "bloom": None, "gpt_neox": None}
    model_dir = tmp_path / "gptj"
    AutoModelForCausalLM.from_config(GPTJConfig(**small, rotary_dim=8, bos_token_id=0, eos_token_id=0,
                                                pad_token_id=3)).save_pretrained(model_dir)
    write_tokenizer(model_dir)
    build_id = write_build(tmp_path / "cache", "sql", random_blocks(6, 32, 0), random_blocks(2, 32, 1), 32, model_dir)
    with pytest.raises(TrainError, match=f"^build {build_id} trains sequences whose position ids run to 28 .* past model "
                                         f"{model_dir}'s context of 16 positions \\(max_position_embeddings\\)"):
        run(make_config(model_dir, tmp_path / "runs"), tmp_path / "cache")
    assert not (tmp_path / "runs").exists()
