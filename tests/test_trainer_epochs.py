"""Epochs as HF Trainer has them: every block once an epoch, ceil(micro-batches / accumulation) steps an
epoch, the last step of an epoch takes the micro-batches left (never the next epoch's) and is normalized
by the supervised tokens it holds (HF's ``num_items_in_batch``); resumable mid-epoch and at that step."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch
from safetensors.torch import load_file

import packtrain.trainer.loop
from packtrain.core.config_train import TrainConfig
from packtrain.core.contract import Manifest, expert_dir
from packtrain.trainer.data.data import BlockDataset, BlockSampler
from packtrain.trainer.data.epochs import micro_batches_per_epoch
from packtrain.trainer.schedule import total_training_steps
from packtrain.trainer.run.train import run
from trainer_fixtures import make_config, pack_docs, random_blocks, tiny_model_dir, write_build

EPOCHS = dict(max_steps=None, per_device_train_batch_size=2, gradient_accumulation_steps=4)


class Crash(Exception):
    pass


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("model"))


def record_feed(monkeypatch) -> tuple[list[dict], list[int]]:
    """Every micro-batch the loop trains on, and the number of micro-batches of every optimizer step."""
    fed, windows = [], []
    forward_loss, forward_backward = packtrain.trainer.loop.forward_loss, packtrain.trainer.loop.forward_backward

    def recording_loss(model, batch, path):
        fed.append(batch)
        return forward_loss(model, batch, path)

    def recording_step(ctx, model, forward_model, window, counts):
        windows.append(len(window))
        return forward_backward(ctx, model, forward_model, window, counts)

    monkeypatch.setattr(packtrain.trainer.loop, "forward_loss", recording_loss)
    monkeypatch.setattr(packtrain.trainer.loop, "forward_backward", recording_step)
    return fed, windows


def blocks_fed(fed: list[dict], blocks: list) -> list[int | None]:
    """The index of every sequence fed, in order; None for padding (no real token, no target)."""
    index = {tuple(pack_docs(docs, 32)[0].tolist()): i for i, docs in enumerate(blocks)}
    out = []
    for batch in fed:
        for ids, labels, n_tokens in zip(batch["input_ids"], batch["labels"], batch["n_tokens"]):
            if int(n_tokens) == 0:
                assert bool((labels == -100).all())  # padding trains nothing
                out.append(None)
            else:
                out.append(index[tuple(ids.tolist())])
    return out


def metrics(run_dir) -> list[dict]:
    return [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if "loss" in r]


# (blocks, micro-batch, accumulation, epochs, world size) -> optimizer steps, HF Trainer's count:
# epochs x ceil(ceil(blocks / (micro x world)) / accumulation)
STEPS = [((12, 2, 4, 1, 1), 2), ((12, 2, 4, 3, 1), 6), ((13, 2, 4, 1, 1), 2), ((10, 2, 4, 2, 1), 4),
         ((6, 2, 4, 5, 1), 5), ((16, 2, 4, 3, 1), 6), ((9, 3, 1, 2, 1), 6), ((30, 6, 2, 2, 1), 6),
         ((14, 2, 2, 3, 2), 6), ((5, 2, 8, 1, 1), 1)]


@pytest.mark.parametrize("shape, steps", STEPS)
def test_steps_are_hf_trainers(shape, steps):
    """Before: ceil(epochs x micro-batches / accumulation), 5 steps for (12, 2, 4, 3) where HF takes 6."""
    blocks, micro, accumulation, epochs, world = shape
    train = TrainConfig(max_steps=None, num_train_epochs=epochs, per_device_train_batch_size=micro,
                        gradient_accumulation_steps=accumulation)
    assert total_training_steps(train, micro_batches_per_epoch(blocks, micro, world)) == steps
    assert total_training_steps(TrainConfig(max_steps=7, num_train_epochs=epochs), 3) == 7  # max_steps wins


def test_the_step_counts_are_what_transformers_computes(tmp_path):
    """The literal counts above, from HF Trainer's own ``set_initial_training_values`` (one process; its
    DataLoader keeps the short last micro-batch, as packtrain's padded one)."""
    import types

    from torch.utils.data import DataLoader
    from transformers import Trainer, TrainingArguments

    for (blocks, micro, accumulation, epochs, world), steps in STEPS:
        if world > 1:
            continue
        args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=micro, use_cpu=True,
                                 gradient_accumulation_steps=accumulation, num_train_epochs=epochs, report_to=[])
        trainer = types.SimpleNamespace(get_total_train_batch_size=lambda _: micro * accumulation,
                                        get_sp_size=lambda: 1, num_examples=lambda _: blocks)
        values = Trainer.set_initial_training_values(trainer, args, DataLoader(range(blocks), batch_size=micro))
        assert values[-1] == steps, (blocks, micro, accumulation, epochs)


def test_every_epoch_trains_every_block_exactly_once(tmp_path, model_dir, monkeypatch):
    """12 blocks, micro-batch 2, accumulation 4: 6 micro-batches an epoch, 2 steps of 4 and 2 (HF Trainer's
    split). Before: 3 epochs were 5 steps of 4 over 40 blocks, a window spanning two epochs."""
    blocks = random_blocks(12, 32, 0)
    write_build(tmp_path / "cache", "sql", blocks, [], 32, model_dir)
    fed, windows = record_feed(monkeypatch)
    run_dir = run(make_config(model_dir, tmp_path / "runs", num_train_epochs=3, **EPOCHS), tmp_path / "cache")
    assert windows == [4, 2, 4, 2, 4, 2]
    assert json.loads((run_dir / "run.json").read_text())["total_steps"] == 6
    assert ("6 steps of 2 x 1 x 4 sequences (per device x world size x gradient accumulation); an epoch: 6 "
            "micro-batches in 2 steps (1 of 4, then 1 of the 2 left)") in (run_dir / "train.log").read_text()
    order = blocks_fed(fed, blocks)
    assert len(order) == 36
    for epoch in range(3):
        assert sorted(order[12 * epoch:12 * (epoch + 1)]) == list(range(12))
    assert order[:12] != order[12:24]  # reshuffled every epoch
    lines = metrics(run_dir)
    assert [r["step"] for r in lines] == [1, 2, 3, 4, 5, 6]
    assert [r["epoch"] for r in lines] == pytest.approx([4 / 6, 1, 1 + 4 / 6, 2, 2 + 4 / 6, 3], abs=1e-12)
    assert json.loads((run_dir / "summary.json").read_text())["epoch"] == 3
    state = json.loads((run_dir / "checkpoint-6" / "state.json").read_text())
    assert (state["epoch"], state["position"]) == (3, 0)


def test_a_block_left_over_by_the_micro_batch_is_trained_beside_padding(tmp_path, model_dir, monkeypatch):
    """13 blocks, micro-batch 2: 7 micro-batches (HF: the last holds 1 block); here the last is filled
    with a padding sequence that trains nothing, so every micro-batch has one shape."""
    blocks = random_blocks(13, 32, 0)
    write_build(tmp_path / "cache", "sql", blocks, [], 32, model_dir)
    fed, windows = record_feed(monkeypatch)
    run_dir = run(make_config(model_dir, tmp_path / "runs", num_train_epochs=1, **EPOCHS), tmp_path / "cache")
    assert windows == [4, 3]
    order = blocks_fed(fed, blocks)
    assert Counter(order) == Counter({**{i: 1 for i in range(13)}, None: 1}) and order[-1] is None
    assert [r["epoch"] for r in metrics(run_dir)] == pytest.approx([4 / 7, 1], abs=1e-12)


def test_max_steps_runs_epochs_whose_last_step_takes_the_leftovers(tmp_path, model_dir, monkeypatch):
    write_build(tmp_path / "cache", "sql", random_blocks(12, 32, 0), [], 32, model_dir)
    _, windows = record_feed(monkeypatch)
    run(make_config(model_dir, tmp_path / "runs", **{**EPOCHS, "max_steps": 5}), tmp_path / "cache")
    assert windows == [4, 2, 4, 2, 4]


def test_micro_batches_fewer_than_the_accumulation_make_one_step_an_epoch(tmp_path, model_dir, monkeypatch):
    """6 blocks, micro-batch 2, accumulation 4: HF's remainder is the 3 micro-batches, one step an epoch."""
    write_build(tmp_path / "cache", "sql", random_blocks(6, 32, 0), [], 32, model_dir)
    _, windows = record_feed(monkeypatch)
    run_dir = run(make_config(model_dir, tmp_path / "runs", num_train_epochs=5, **EPOCHS), tmp_path / "cache")
    assert windows == [3, 3, 3, 3, 3]
    assert json.loads((run_dir / "run.json").read_text())["total_steps"] == 5


def test_the_last_short_step_is_normalized_as_hf_normalizes_it(tmp_path, model_dir):
    """Step 2 of a 12-block epoch (micro-batch 2, accumulation 4) holds the epoch's last 4 blocks: its loss
    and gradient are HF's: each micro-batch's summed token loss / the supervised tokens of the whole
    window (``num_items_in_batch``), computed here by the HF model itself from step 1's adapter. One
    document per block, so plain causal attention equals the packed one on every supervised token."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    blocks = random_blocks(12, 32, 0, docs_per_block=(1, 1))
    build_id = write_build(tmp_path / "cache", "sql", blocks, [], 32, model_dir)
    run_dir = run(make_config(model_dir, tmp_path / "runs", num_train_epochs=1, save_steps=1, max_grad_norm=1e6,
                              **EPOCHS), tmp_path / "cache")
    logged = metrics(run_dir)[1]
    assert logged["step"] == 2

    build_dir = expert_dir(tmp_path / "cache", "sql") / build_id
    dataset = BlockDataset(build_dir, Manifest.load(build_dir), "train")
    last = BlockSampler(12, 42, build_id).order(0)[8:12].tolist()  # the epoch's last 4 blocks (seed 42)
    items = [dataset[i] for i in last]
    micro_batches = [items[:2], items[2:]]
    num_items = sum(int((item["labels"][1:] != -100).sum()) for item in items)  # HF: the shifted labels

    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir),
                                      run_dir / "checkpoint-1" / "adapter", is_trainable=True)
    model.train()
    loss = 0.0
    for micro in micro_batches:
        out = model(input_ids=torch.stack([i["input_ids"] for i in micro]),
                    labels=torch.stack([i["labels"] for i in micro]), num_items_in_batch=num_items)
        out.loss.backward()
        loss += out.loss.item()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])).item()
    assert logged["loss"] == pytest.approx(loss, rel=1e-5)
    assert logged["grad_norm"] == pytest.approx(norm, rel=1e-4)


def crash_after_checkpoint(monkeypatch, step: int):
    save = packtrain.trainer.loop.save_checkpoint

    def save_then_crash(run_info, state, *args):
        path = save(run_info, state, *args)
        if state.step == step:
            raise Crash(path.name)
        return path

    monkeypatch.setattr(packtrain.trainer.loop, "save_checkpoint", save_then_crash)


def step_losses(run_dir) -> list[tuple[int, float, float]]:
    return [(r["step"], r["loss"], r["grad_norm"]) for r in metrics(run_dir)]


def crashed_and_resumed(tmp_path, model_dir, monkeypatch, crash_at: int, **settings):
    """(the uninterrupted run's directory, the run crashed after checkpoint ``crash_at`` and resumed, that
    checkpoint's state.json); LoRA dropout 0.1, so the resume must restore the RNG too."""
    lora = {"dropout": 0.1}
    full = run(make_config(model_dir, tmp_path / "runs", lora=lora, run_name="full", **settings), tmp_path / "cache")
    config = make_config(model_dir, tmp_path / "runs", lora=lora, run_name="part", **settings)
    crash_after_checkpoint(monkeypatch, crash_at)
    with pytest.raises(Crash):
        run(config, tmp_path / "cache")
    monkeypatch.undo()
    part = tmp_path / "runs" / "sql" / "part"
    state = json.loads((part / f"checkpoint-{crash_at}" / "state.json").read_text())
    run(config, tmp_path / "cache", resume="auto")
    return full, part, state


def same_adapters(a_run, b_run) -> bool:
    a, b = (load_file(d / "adapter" / "adapter_model.safetensors") for d in (a_run, b_run))
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("crash_at, position", [(1, (0, 8)), (2, (1, 0))])
def test_resume_mid_epoch_and_after_the_short_step_is_exact(tmp_path, model_dir, monkeypatch, crash_at, position):
    """Crash after step 1 (mid-epoch: 8 of 12 blocks) or step 2 (the epoch's short last step: the next
    epoch starts at 0); the resumed run trains the uninterrupted run's steps bit for bit."""
    write_build(tmp_path / "cache", "sql", random_blocks(12, 32, 0), random_blocks(2, 32, 1), 32, model_dir)
    full, part, state = crashed_and_resumed(tmp_path, model_dir, monkeypatch, crash_at, num_train_epochs=3,
                                            save_steps=1, eval_steps=2, warmup_steps=1, lr_scheduler_type="cosine",
                                            **EPOCHS)
    assert (state["epoch"], state["position"]) == position
    assert step_losses(part) == step_losses(full) and len(step_losses(full)) == 6
    assert same_adapters(full, part)


def test_a_resume_with_another_global_batch_trains_the_rest_of_the_epoch(tmp_path, model_dir, monkeypatch):
    """A checkpoint taken after 2 of 12 blocks (micro-batch 2), resumed with micro-batch 4: the epoch's 10
    blocks left are 2 micro-batches of 4 and one of 2 blocks and 2 PAD, then the next epoch. Before: the
    epoch's end was counted in micro-batches of 4 from the start, so the 2 blocks left made no micro-batch,
    and every later step was empty (loss 0, nothing trained) until max_steps."""
    blocks = random_blocks(12, 32, 0)
    build_id = write_build(tmp_path / "cache", "sql", blocks, [], 32, model_dir)
    settings = dict(max_steps=5, save_steps=1, gradient_accumulation_steps=1)
    crash_after_checkpoint(monkeypatch, 1)
    with pytest.raises(Crash):
        run(make_config(model_dir, tmp_path / "runs", run_name="r", per_device_train_batch_size=2, **settings),
            tmp_path / "cache")
    monkeypatch.undo()
    fed, windows = record_feed(monkeypatch)
    run_dir = run(make_config(model_dir, tmp_path / "runs", run_name="r", per_device_train_batch_size=4, **settings),
                  tmp_path / "cache", resume="auto")
    assert windows == [1, 1, 1, 1]
    sampler = BlockSampler(12, 42, build_id)
    assert blocks_fed(fed, blocks) == sampler.order(0)[2:].tolist() + [None, None] + sampler.order(1)[:4].tolist()
    assert [r["loss"] > 0 for r in metrics(run_dir)] == [True] * 5
    state = json.loads((run_dir / "checkpoint-4" / "state.json").read_text())
    assert (state["epoch"], state["position"]) == (1, 0)
