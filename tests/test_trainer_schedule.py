"""Schedule, step count, optimizer choice and the FLOP formula: literal values."""

from __future__ import annotations

import pytest
import torch

from packtrain.core.config import ConfigError
from packtrain.core.config_train import LoraConfig, TrainConfig
from packtrain.core.configfile import config_from_dict
from packtrain.trainer.report.metrics import FlopCounter, oom_advice
from packtrain.trainer.optim import build_optimizer
from packtrain.trainer.schedule import build_scheduler, lr_multiplier, warmup_steps
from packtrain.trainer.schedule import total_training_steps


def test_warmup_then_cosine_linear_constant():
    assert [round(lr_multiplier(s, 2, 6, "cosine"), 4) for s in range(6)] == [0.5, 1.0, 1.0, 0.8536, 0.5, 0.1464]
    assert [round(lr_multiplier(s, 2, 6, "linear"), 4) for s in range(6)] == [0.5, 1.0, 1.0, 0.75, 0.5, 0.25]
    assert [lr_multiplier(s, 2, 6, "constant") for s in range(6)] == [0.5, 1.0, 1.0, 1.0, 1.0, 1.0]
    assert warmup_steps(TrainConfig(warmup_steps=0, warmup_ratio=0.03), 1000) == 30
    assert warmup_steps(TrainConfig(warmup_steps=7, warmup_ratio=0.5), 1000) == 7


def test_scheduler_drives_the_optimizer_lr():
    p = torch.nn.Parameter(torch.zeros(2))
    train = TrainConfig(learning_rate=0.1, warmup_steps=1, lr_scheduler_type="linear")
    optimizer = build_optimizer([p], train, torch.device("cpu"))
    scheduler = build_scheduler(optimizer, train, total_steps=3)
    lrs = []
    for _ in range(3):
        lrs.append(round(scheduler.get_last_lr()[0], 6))
        optimizer.step()
        scheduler.step()
    assert lrs == [0.1, 0.1, 0.05]
    assert not optimizer.defaults.get("fused")  # fused AdamW is CUDA-only


def test_total_steps_from_epochs_or_max_steps():
    assert total_training_steps(TrainConfig(max_steps=100), batches_per_epoch=7) == 100  # max_steps wins
    assert total_training_steps(TrainConfig(max_steps=3, num_train_epochs=2), 7) == 3
    assert total_training_steps(TrainConfig(num_train_epochs=2, gradient_accumulation_steps=4), 7) == 4
    assert total_training_steps(TrainConfig(), batches_per_epoch=7) == 7  # default: one epoch


def test_flops_count_4n_plus_lora_plus_attention():
    from transformers import AutoModelForCausalLM, Qwen2Config

    from packtrain.trainer.model.adapters import attach_adapters

    cfg = Qwen2Config(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    model = attach_adapters(AutoModelForCausalLM.from_config(cfg), LoraConfig(r=2, target_modules=["q_proj"]), False)
    flops = FlopCounter.for_model(model)
    total = sum(p.numel() for p in model.parameters())
    assert flops.matmul_params == total  # tied head: the embedding matrix counted once, as the head
    assert flops.trainable_params == 2 * (2 * 32 + 32 * 2)  # 2 layers x (A: r x in, B: out x r)
    assert flops.attn_flops_per_pair == 12 * 2 * 32
    # 2 documents of 3 and 1 tokens: 4 tokens, 3*4/2 + 1 = 7 attention pairs
    assert flops.step_flops(4, 7) == (4 * total + 2 * flops.trainable_params) * 4 + 12 * 2 * 32 * 7


def test_oom_advice_names_the_knobs():
    message = oom_advice(TrainConfig(), LoraConfig())
    for knob in ("per_device_train_batch_size", "gradient_checkpointing", "lora.method: qlora", "block_size",
                 "adamw_bnb_8bit"):
        assert knob in message
    # the rebuild as the user would run it (it said `make pretokenize` to a CLI user, with no expert)
    assert "(needs a rebuild: `packtrain pretokenize sql --set pack.block_size=1024`)" in oom_advice(
        TrainConfig(), LoraConfig(), "sql")


def test_train_config_validation_reports_every_problem():
    with pytest.raises(ConfigError) as err:
        config_from_dict({"expert": "sql", "sources": [{"name": "bundled"}],
                          "lora": {"alpha": 0},
                          "train": {"max_bad_steps": 0, "run_name": "../escape", "warmup_steps": -1}})
    for field in ("lora.alpha", "train.max_bad_steps", "train.run_name", "train.warmup_steps"):
        assert field in str(err.value)
