"""Invariants of the loop: gradient accumulation is exact, non-finite losses never reach the weights."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

import packtrain.trainer.loop
from packtrain.trainer.run.checkpoint import complete_checkpoints
from packtrain.trainer.data.data import collate
from packtrain.trainer.loop import NonFiniteLossError
from packtrain.trainer.loss import token_loss_sum
from packtrain.trainer.model.model import packed_forward
from packtrain.trainer.run.train import run
from trainer_fixtures import make_config, random_blocks, tiny_model_dir, write_build


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("model"))


def train_losses(run_dir):
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in lines if "loss" in r and "skipped" not in r}


def test_bs1_ga8_equals_bs8_ga1(tmp_path, model_dir, monkeypatch):
    # blocks with 1..4 documents and random prompt lengths: supervised-token counts differ a lot;
    # every other block repeats one token, so per-block mean losses differ a lot too
    blocks = random_blocks(8, 48, seed=11)
    blocks = [docs if i % 2 else [([7] * len(t), p) for t, p in docs] for i, docs in enumerate(blocks)]
    build_id = write_build(tmp_path / "cache", "sql", blocks, [], 48, model_dir)

    grads = {}
    clip = torch.nn.utils.clip_grad_norm_

    def capture(params, *args, **kwargs):  # the gradients the optimizer step is about to use
        grads[run_name] = [p.grad.detach().clone() for p in params]
        return clip(params, *args, **kwargs)

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", capture)
    losses = {}
    for run_name, bs, ga in (("bs1-ga8", 1, 8), ("bs8-ga1", 8, 1)):
        config = make_config(model_dir, tmp_path / "runs", max_steps=1, per_device_train_batch_size=bs,
                             gradient_accumulation_steps=ga, run_name=run_name)
        losses[run_name] = train_losses(run(config, tmp_path / "cache"))[1]

    assert losses["bs1-ga8"] == pytest.approx(losses["bs8-ga1"], rel=1e-5)
    assert len(grads["bs1-ga8"]) == len(grads["bs8-ga1"]) > 0
    for a, b in zip(grads["bs1-ga8"], grads["bs8-ga1"]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-8)

    # the logged loss is the token-weighted mean; a mean of per-block means would be another number
    # (at step 1 lora_B is zero, so the adapted model computes exactly what the base model does)
    from packtrain.trainer.data.data import BlockDataset
    from packtrain.core.contract import Manifest, expert_dir
    build_dir = expert_dir(tmp_path / "cache", "sql") / build_id
    ds = BlockDataset(build_dir, Manifest.load(build_dir), "train")
    base = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa")
    sums, counts = [], []
    with torch.no_grad():
        for i in range(len(ds)):
            batch = collate([ds[i]])
            sums.append(token_loss_sum(packed_forward(base, batch["input_ids"], batch["position_ids"]),
                                       batch["labels"]).item())
            counts.append(batch["n_sup"].item())
    assert len(set(counts)) > 4
    assert losses["bs8-ga1"] == pytest.approx(sum(sums) / sum(counts), rel=1e-5)
    mean_of_means = sum(s / c for s, c in zip(sums, counts)) / len(sums)
    assert abs(mean_of_means - losses["bs8-ga1"]) > 1e-3


def poison_losses(monkeypatch, bad_steps: set[int]):
    """Make the loss of the given optimizer steps NaN (one micro-batch per step in these tests)."""
    calls = {"n": 0}
    real = packtrain.trainer.loop.forward_loss

    def loss(*args, **kwargs):
        calls["n"] += 1
        value = real(*args, **kwargs)
        return value * float("nan") if calls["n"] in bad_steps else value

    monkeypatch.setattr(packtrain.trainer.loop, "forward_loss", loss)


def adapter_tensors(path):
    return load_file(path / "adapter" / "adapter_model.safetensors")


def test_a_non_finite_loss_skips_its_step(tmp_path, model_dir, monkeypatch):
    write_build(tmp_path / "cache", "sql", random_blocks(8, 32, 0), [], 32, model_dir)
    poison_losses(monkeypatch, {3})
    config = make_config(model_dir, tmp_path / "runs", max_steps=5, save_steps=1, save_total_limit=10)
    run_dir = run(config, tmp_path / "cache")
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines if r.get("skipped")] == [3]
    assert sorted(train_losses(run_dir)) == [1, 2, 4, 5]
    assert all(math.isfinite(v) for v in train_losses(run_dir).values())
    # no checkpoint of the skipped step; the weights after it are those of step 2
    assert [p.name for p in complete_checkpoints(run_dir)] == ["checkpoint-1", "checkpoint-2", "checkpoint-4",
                                                              "checkpoint-5"]


def test_repeated_non_finite_losses_stop_without_saving(tmp_path, model_dir, monkeypatch):
    write_build(tmp_path / "cache", "sql", random_blocks(8, 32, 0), [], 32, model_dir)
    poison_losses(monkeypatch, set(range(3, 100)))
    config = make_config(model_dir, tmp_path / "runs", max_steps=10, save_steps=1, save_total_limit=10,
                         max_bad_steps=3, run_name="poisoned")
    with pytest.raises(NonFiniteLossError, match=r"3 consecutive non-finite losses \(steps 3..5\)"):
        run(config, tmp_path / "cache")
    run_dir = tmp_path / "runs" / "sql" / "poisoned"
    assert [p.name for p in complete_checkpoints(run_dir)] == ["checkpoint-1", "checkpoint-2"]
    assert not list(run_dir.glob(".tmp-*")) and not (run_dir / "adapter").exists()
    assert all(torch.isfinite(t).all() for t in adapter_tensors(run_dir / "checkpoint-2").values())
    assert "NonFiniteLossError" in (run_dir / "train.log").read_text()


def test_fp16_grad_scaler_survives_a_skipped_step(tmp_path, model_dir, monkeypatch):
    """With a GradScaler (fp16), a skipped step must still close the scaler's step, or the next
    unscale_ raises 'unscale_() has already been called'."""
    import packtrain.trainer.run.context
    from packtrain.trainer.model.model import Precision

    write_build(tmp_path / "cache", "sql", random_blocks(8, 32, 0), [], 32, model_dir)
    poison_losses(monkeypatch, {2})
    monkeypatch.setattr(packtrain.trainer.run.context, "choose_precision",
                        lambda train, device: Precision(torch.float32, None, True, "test: fp32 with a GradScaler"))
    run_dir = run(make_config(model_dir, tmp_path / "runs", max_steps=4), tmp_path / "cache")
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines if r.get("skipped")] == [2]
    assert sorted(train_losses(run_dir)) == [1, 3, 4]


def test_a_non_finite_gradient_with_a_finite_loss_is_skipped(tmp_path, model_dir, monkeypatch):
    write_build(tmp_path / "cache", "sql", random_blocks(8, 32, 0), [], 32, model_dir)
    calls = {"n": 0}
    real = torch.nn.utils.clip_grad_norm_

    def clip(params, max_norm):
        calls["n"] += 1
        norm = real(params, max_norm)
        return norm * float("inf") if calls["n"] == 2 else norm

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", clip)
    run_dir = run(make_config(model_dir, tmp_path / "runs", max_steps=3, save_steps=1, save_total_limit=10),
                  tmp_path / "cache")
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["skipped"]) for r in lines if r.get("skipped")] == [(2, "non-finite gradient norm")]
    assert all(torch.isfinite(t).all() for t in adapter_tensors(run_dir).values())
