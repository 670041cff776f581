"""The chunked loss (trainer/loss.py) equals the full-logits reference, without the full logits."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoModelForCausalLM

import packtrain.trainer.loss
import packtrain.trainer.step
from packtrain.core.config import ConfigError
from packtrain.core.config_train import LoraConfig
from packtrain.trainer.model.adapters import attach_adapters
from packtrain.trainer.data.data import IGNORE_INDEX, position_ids_from_doc_lens
from packtrain.trainer.eval.evaluate import evaluate
from packtrain.trainer.model.model import Precision
from packtrain.trainer.step import LossPath, packed_loss_sum
from trainer_fixtures import VOCAB, pack_docs, random_blocks, tiny_model_dir

BLOCK = 64
FP32 = Precision(torch.float32, None, False, "test: fp32")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("model"))


def lora_model(model_dir, target_modules="all-linear", dropout=0.0, checkpointing=False):
    base = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa")
    base.config.use_cache = False
    base.requires_grad_(False)
    model = attach_adapters(base, LoraConfig(r=8, alpha=16, dropout=dropout, target_modules=target_modules),
                            checkpointing)
    torch.manual_seed(1)
    with torch.no_grad():  # lora_B starts at zero: give it values, so the adapter changes the loss
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.05)
    return model


def batch_of(blocks):
    """What BlockDataset + collate give for these blocks (labels -100 off the mask and at doc starts)."""
    rows = [pack_docs(docs, BLOCK) for docs in blocks]
    ids = torch.from_numpy(np.stack([r[0] for r in rows]))
    position_ids = torch.from_numpy(np.stack([position_ids_from_doc_lens(r[2], BLOCK) for r in rows]))
    mask = torch.from_numpy(np.stack([r[1] for r in rows])).bool() & (position_ids != 0)
    labels = torch.where(mask, ids, IGNORE_INDEX)
    return {"input_ids": ids, "position_ids": position_ids, "labels": labels, "n_sup": mask.sum(1)}


def blocks_with_edge_cases():
    blocks = random_blocks(3, BLOCK, seed=5, docs_per_block=(2, 4))  # several documents + padding
    prompt_only = [(list(range(10, 30)), 20), (list(range(40, 50)), 10)]  # zero supervised tokens
    return blocks + [prompt_only]


def loss_and_grads(model, batch, chunked, seed=0):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)  # the same dropout masks for both paths
    loss = packed_loss_sum(model, batch["input_ids"], batch["position_ids"], batch["labels"], chunked=chunked)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    return loss.detach(), grads


@pytest.mark.parametrize("case", ["lora", "dropout-checkpointing", "lora-head"])
@pytest.mark.parametrize("chunk", [5, None])  # many chunks (5 rows each) and one chunk (the default)
def test_chunked_loss_and_gradients_equal_the_full_logits_path(model_dir, monkeypatch, case, chunk):
    if case == "lora":
        model = lora_model(model_dir)
    elif case == "dropout-checkpointing":  # same seed, same dropout masks in the decoder; recomputed alike
        model = lora_model(model_dir, dropout=0.1, checkpointing=True)
    else:  # a LoRA-adapted output head (tied to the embedding); no dropout: its masks would have other shapes
        model = lora_model(model_dir, ["q_proj", "v_proj", "down_proj", "lm_head"], checkpointing=True)
        assert any("lm_head.lora_A" in n for n, _ in model.named_parameters())
    model.train()
    if chunk:
        monkeypatch.setattr(packtrain.trainer.loss, "CHUNK_TOKENS", chunk)
    batch = batch_of(blocks_with_edge_cases())
    assert batch["n_sup"].tolist()[-1] == 0 and batch["n_sup"].sum() > 3 * 5

    ref_loss, ref_grads = loss_and_grads(model, batch, chunked=False)
    loss, grads = loss_and_grads(model, batch, chunked=True)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=0)
    assert ref_grads.keys() == grads.keys() and len(grads) > 0
    assert any(g.abs().max() > 0 for g in grads.values())
    for name in grads:  # fp32 sums in another order: elements near 0 get an absolute slack of 1e-5 x the largest
        ref = ref_grads[name]
        torch.testing.assert_close(grads[name], ref, rtol=1e-5, atol=1e-5 * float(ref.abs().max()),
                                   msg=lambda m: f"{name}: {m}")


def test_a_block_without_supervised_tokens(model_dir):
    model = lora_model(model_dir)
    batch = batch_of(blocks_with_edge_cases()[-1:])
    assert batch["n_sup"].item() == 0
    for chunked in (False, True):
        loss, grads = loss_and_grads(model, batch, chunked)
        assert loss.item() == 0.0
        assert all(g.abs().max() == 0 for g in grads.values())


class LargestTensors(TorchDispatchMode):
    """Records the largest tensor any op allocates whose last dimension is the vocabulary (forward
    and backward: autograd runs CPU backward ops in this thread, under this mode)."""

    def __init__(self, vocab):
        super().__init__()
        self.vocab, self.largest = vocab, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.is_view:  # a view allocates nothing (e.g. the tied embedding's transpose)
            return out
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and t.dim() >= 1 and t.shape[-1] == self.vocab:
                self.largest = max(self.largest, t.numel())
        return out


def test_the_full_logits_are_never_materialized(model_dir, monkeypatch):
    model = lora_model(model_dir)
    model.train()
    monkeypatch.setattr(packtrain.trainer.loss, "CHUNK_TOKENS", 16)
    batch = batch_of(random_blocks(2, BLOCK, seed=9, docs_per_block=(1, 3)))
    b, t = batch["input_ids"].shape
    assert batch["n_sup"].sum() > 16  # several chunks
    largest = {}
    for chunked in (False, True):
        with LargestTensors(VOCAB) as mode:
            loss = packed_loss_sum(model, batch["input_ids"], batch["position_ids"], batch["labels"], chunked=chunked)
            loss.backward()
        largest[chunked] = mode.largest
    assert largest[False] >= b * t * VOCAB  # the check has teeth: the reference path makes [B, T, V]
    assert largest[True] <= max(16, b) * VOCAB  # one chunk's logits (or the [B, 1, V] of the last position)


def test_eval_loss_is_the_same_with_the_chunked_loss(model_dir):
    model = lora_model(model_dir)
    loader = [batch_of(blocks_with_edge_cases()[:2]), batch_of(blocks_with_edge_cases()[2:])]
    chunked = evaluate(model, loader, LossPath(torch.device("cpu"), FP32, chunked=True))
    full = evaluate(model, loader, LossPath(torch.device("cpu"), FP32, chunked=False))
    assert chunked["eval/tokens"] == full["eval/tokens"] > 0
    assert chunked["eval/loss"] == pytest.approx(full["eval/loss"], rel=1e-6)
    assert model.training  # evaluate restores the mode it found


def test_a_head_that_transforms_logits_uses_the_full_logits_and_says_so_once(model_dir, caplog):
    model = lora_model(model_dir)
    model.get_base_model().config.final_logit_softcapping = 30.0  # as Gemma 2 would have it
    batch = batch_of(blocks_with_edge_cases()[:2])
    calls = []
    real = packtrain.trainer.step.packed_forward
    with caplog.at_level(logging.WARNING, logger="packtrain.train"):
        import unittest.mock
        with unittest.mock.patch.object(packtrain.trainer.step, "packed_forward", lambda *a: calls.append(1) or real(*a)):
            for _ in range(2):
                packed_loss_sum(model, batch["input_ids"], batch["position_ids"], batch["labels"])
    assert len(calls) == 2  # the full-logits path ran
    said = [r.message for r in caplog.records if "chunked_loss" in r.message]
    assert len(said) == 1 and "final_logit_softcapping=30.0" in said[0], said


def reference_linear_cross_entropy(states, weight, targets, reduction="sum"):
    """A pure-torch stand-in with cut-cross-entropy's call signature (the real one needs CUDA)."""
    assert reduction == "sum" and states.dim() == 2 and weight.shape[1] == states.shape[1]
    return torch.nn.functional.cross_entropy((states @ weight.T).float(), targets, reduction="sum")


def test_fused_path_gives_the_chunked_loss_and_gradients(model_dir):
    """The fused path's wiring (gathered supervised rows, the head's weight, sum reduction), in bf16
    so the head qualifies; the kernel is a pure-torch stand-in on CPU (tests/test_gpu.py: the real one)."""
    batch = batch_of(blocks_with_edge_cases())
    results = {}
    for name, fused in (("chunked", None), ("fused", reference_linear_cross_entropy)):
        model = lora_model(model_dir).to(torch.bfloat16)
        loss = packed_loss_sum(model, batch["input_ids"], batch["position_ids"], batch["labels"], fused=fused)
        loss.backward()
        grads = {n: p.grad.float().clone() for n, p in model.named_parameters() if p.requires_grad}
        results[name] = (loss.detach().float(), grads)
    torch.testing.assert_close(results["fused"][0], results["chunked"][0], rtol=1e-2, atol=1e-2)
    for n, g in results["chunked"][1].items():
        torch.testing.assert_close(results["fused"][1][n], g, rtol=5e-2, atol=1e-3)


def test_fused_path_without_targets_is_a_connected_zero(model_dir):
    model = lora_model(model_dir).to(torch.bfloat16)
    prompt_only = batch_of([[(list(range(10, 30)), 20)]])
    loss = packed_loss_sum(model, prompt_only["input_ids"], prompt_only["position_ids"], prompt_only["labels"],
                           fused=reference_linear_cross_entropy)
    loss.backward()
    assert loss.item() == 0.0 and all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_fused_kernel_choice_off_cuda():
    cpu = torch.device("cpu")
    assert packtrain.trainer.loss.fused_kernel("auto", cpu) is None and packtrain.trainer.loss.fused_kernel(False, cpu) is None
    with pytest.raises(ConfigError, match="fused_loss: true needs CUDA"):
        packtrain.trainer.loss.fused_kernel(True, cpu)


def test_an_fp32_or_lora_head_is_not_fused(model_dir, caplog):
    """fp32 states (CPU training) and a LoRA-wrapped head take the chunked path, said once."""
    head = torch.nn.Linear(8, 16, bias=False)
    with caplog.at_level(logging.WARNING, logger="packtrain.train"):
        assert not packtrain.trainer.loss._fusable(head, torch.zeros(2, 8))
    assert packtrain.trainer.loss._fusable(head.to(torch.bfloat16), torch.zeros(2, 8, dtype=torch.bfloat16))
    assert not packtrain.trainer.loss._fusable(torch.nn.Linear(8, 16, bias=True).to(torch.bfloat16),
                                     torch.zeros(2, 8, dtype=torch.bfloat16))
    assert "not a plain bf16/fp16 linear layer" in caplog.text
