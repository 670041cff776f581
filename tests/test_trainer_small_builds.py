"""Builds with fewer train sequences than one global micro-batch train as HF Trainer trains them: one short
step an epoch, every block once an epoch, the micro-batch filled with padding that trains nothing (HF: a
shorter batch), the loss over the supervised tokens the step holds. Before, such a build was refused ("has 3
train blocks, fewer than per_device_train_batch_size 4"). Only a build with no train sequence is refused."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from packtrain.core.contract import Manifest, expert_dir
from packtrain.trainer.data.data import BlockDataset, BlockSampler
from packtrain.trainer.run.run_checks import TrainError
from packtrain.trainer.run.train import run
from test_trainer_distributed import SETTINGS, assert_same_run, run_two_ranks, single_process_reference
from test_trainer_epochs import blocks_fed, crashed_and_resumed, metrics, record_feed, same_adapters, step_losses
from trainer_fixtures import make_config, random_blocks, tiny_model_dir, write_build


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("model"))


def hf_step(model_dir, adapter, items: list[dict], micro: int) -> tuple[float, float]:
    """HF's loss and gradient norm of one optimizer step over ``items``, in HF's micro-batches of ``micro``
    (the last one short): each micro-batch's summed token loss / the step's supervised tokens
    (``num_items_in_batch``), from ``adapter``."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir), adapter, is_trainable=True)
    model.train()
    num_items = sum(int((item["labels"][1:] != -100).sum()) for item in items)  # HF: the shifted labels
    loss = 0.0
    for start in range(0, len(items), micro):
        batch = items[start:start + micro]
        out = model(input_ids=torch.stack([i["input_ids"] for i in batch]),
                    labels=torch.stack([i["labels"] for i in batch]), num_items_in_batch=num_items)
        out.loss.backward()
        loss += out.loss.item()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    return loss, torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])).item()


@pytest.mark.parametrize("batch, micro, windows, shape", [
    (dict(per_device_train_batch_size=4), 4, [1, 1], "2 steps of 4 x 1 x 1 sequences"),
    # auto: 16 per device, capped at the 3 sequences there are: 2 (the largest divisor of 16 up to 3) x 8
    (dict(per_device_train_batch_size="auto", global_batch_size=16), 2, [2, 2], "2 steps of 2 x 1 x 8 sequences"),
])
def test_three_blocks_train_two_epochs_as_hf_trains_them(tmp_path, model_dir, monkeypatch, batch, micro, windows,
                                                         shape):
    """3 blocks, a micro-batch of 4 (or auto with a global batch of 16), 2 epochs: one step an epoch over the 3
    blocks and padding, every block once an epoch, the loss and gradient HF's. Before: refused."""
    blocks = random_blocks(3, 32, 0, docs_per_block=(1, 1))  # one document a block: plain causal attention is HF's
    build_id = write_build(tmp_path / "cache", "sql", blocks, [], 32, model_dir)
    fed, seen = record_feed(monkeypatch)
    run_dir = run(make_config(model_dir, tmp_path / "runs", max_steps=None, num_train_epochs=2, save_steps=1,
                              max_grad_norm=1e6, **batch), tmp_path / "cache")
    assert seen == windows
    info = json.loads((run_dir / "run.json").read_text())
    assert (info["total_steps"], info["per_device_train_batch_size"]) == (2, micro)  # HF: 2 x ceil(3 / 16)
    log = (run_dir / "train.log").read_text()
    assert f"3 train blocks of 32 tokens, {shape}" in log
    assert f"an epoch: {windows[0]} micro-batch{'es' if windows[0] > 1 else ''} in 1 step of {windows[0]}" in log
    if batch["per_device_train_batch_size"] == "auto":
        assert ("micro-batch auto on cpu: 2 block(s) x 8 accumulation (no device memory to measure: the largest "
                "divisor up to 8); capped at 3: 3 train sequence(s) over 1 rank(s), at most 3 a rank") in log
    order = blocks_fed(fed, blocks)
    assert len(order) == 8 and [order[:4].count(None), order[4:].count(None)] == [1, 1]
    sampler = BlockSampler(3, 42, build_id)
    for epoch in range(2):
        assert [i for i in order[4 * epoch:4 * epoch + 4] if i is not None] == sampler.order(epoch)[:3].tolist()
    lines = metrics(run_dir)
    assert [r["epoch"] for r in lines] == [1, 2]
    state = json.loads((run_dir / "checkpoint-2" / "state.json").read_text())
    assert (state["epoch"], state["position"]) == (2, 0)

    build_dir = expert_dir(tmp_path / "cache", "sql") / build_id
    dataset = BlockDataset(build_dir, Manifest.load(build_dir), "train")
    items = [dataset[i] for i in sampler.order(1)[:3].tolist()]  # step 2: epoch 1's 3 blocks
    loss, norm = hf_step(model_dir, run_dir / "checkpoint-1" / "adapter", items, micro)
    assert lines[1]["loss"] == pytest.approx(loss, rel=1e-5)
    assert lines[1]["grad_norm"] == pytest.approx(norm, rel=1e-4)


@pytest.mark.parametrize("crash_at", [1, 2])
def test_a_three_block_run_resumes_bit_for_bit(tmp_path, model_dir, monkeypatch, crash_at):
    """3 blocks, micro-batch 4, 3 epochs of one padded step each: a crash after step 1 or 2 and a resume train
    the uninterrupted run's steps and adapter exactly."""
    write_build(tmp_path / "cache", "sql", random_blocks(3, 32, 0), random_blocks(1, 32, 1), 32, model_dir)
    full, part, state = crashed_and_resumed(tmp_path, model_dir, monkeypatch, crash_at, max_steps=None,
                                            num_train_epochs=3, per_device_train_batch_size=4, save_steps=1,
                                            eval_steps=2, warmup_steps=1, lr_scheduler_type="cosine")
    assert (state["epoch"], state["position"]) == (crash_at, 0)
    assert step_losses(part) == step_losses(full) and len(step_losses(full)) == 3
    assert same_adapters(full, part)


def test_a_build_without_train_blocks_is_refused_in_one_line(tmp_path, model_dir):
    """Nothing to train: refused before anything is written, naming the build and the fix."""
    build_id = write_build(tmp_path / "cache", "sql", [], random_blocks(2, 32, 1), 32, model_dir)
    with pytest.raises(TrainError) as refused:
        run(make_config(model_dir, tmp_path / "runs"), tmp_path / "cache")
    message = str(refused.value)
    assert "\n" not in message
    assert message == (f"build {build_id} ({expert_dir(tmp_path / 'cache', 'sql') / build_id}) has no train blocks: "
                       "nothing to train; add rows to sources: or lower pack.val_fraction (0.1), and rebuild with "
                       "`packtrain pretokenize sql`")
    assert not (tmp_path / "runs").exists()


def one_block_reference(tmp_path, monkeypatch) -> tuple:
    """A build of 1 train and 1 val block and one process's run with the global batch (4 x ga 2): 4 epochs of
    one step, each on the block and 3 padding sequences."""
    return single_process_reference(tmp_path, monkeypatch, train_blocks=1, val_blocks=1)


@pytest.mark.skipif(sys.platform != "linux", reason="gloo over TCP on localhost, tested on Linux")
@pytest.mark.parametrize("fsdp", [False, True])
def test_one_block_over_two_ranks_trains_as_one_process(tmp_path, monkeypatch, fsdp):
    """World 2, 1 train block, 1 val block: rank 1 trains on padding only (loss 0, normalized by the global
    supervised count) and evaluates nothing (DDP) or a padding block (FSDP, where every forward is a
    collective); the run equals one process's. Before: refused (1 block, fewer than 2 x world size 2)."""
    model_dir, single = one_block_reference(tmp_path, monkeypatch)
    name = "fsdp" if fsdp else "ddp"
    ranks, _ = run_two_ranks(tmp_path, model_dir, name, settings={**SETTINGS, "fsdp": fsdp})
    assert_same_run(ranks, single)
    assert "1 train block of 32 tokens, 4 steps of 2 x 2 x 2 sequences" in (ranks / "train.log").read_text()
    state = json.loads((ranks / "checkpoint-4" / "state.json").read_text())
    assert (state["epoch"], state["position"]) == (4, 0)
