"""packtrain.hf: a build read by HF Trainer and TRL (issue 47, item 4).

- A row of ``load_build`` is what packtrain's trainer trains on (literal values, and item for item), over
  the memory-mapped shards (its buffers lie in the shard files' mappings) without writing anything.
- The collator's batch: literal position ids, ``cu_seq_lens`` and layouts.
- The recipes of docs/INTEROP.md, run as written on a tiny model: HF Trainer and TRL's SFTTrainer train 3
  steps with packtrain's own per-step losses and gradient norms on the same blocks (relative 1e-6 in fp32;
  about 5e-8 seen). The blocks hold documents whose first token is supervised, so the boundary rule counts.
  With packtrain's block order in place of HF's shuffle, the HF recipe's steps over a longer epoch too.
- Each refusal is one line.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from packtrain.core.contract import MANIFEST, Manifest, resolve_build
from packtrain.core.errors import PacktrainError
from packtrain.hf import PackedCollator, load_build
from packtrain.trainer.data.data import BlockDataset
from packtrain.trainer.run.train import run
from trainer_fixtures import make_config, random_blocks, tiny_model_dir, write_build

ROOT = Path(__file__).resolve().parents[1]
BLOCK = 32
RECIPE_SETTINGS = dict(per_device_train_batch_size=2, gradient_accumulation_steps=2, learning_rate=2e-4,
                       lr_scheduler_type="cosine", warmup_steps=0, warmup_ratio=0.0, seed=42)  # docs/INTEROP.md's
STEPS = 3


def boundary_blocks(n: int, seed: int) -> list:
    """Random blocks in which every other document has no prompt: its first token is masked in, and only
    the boundary rule (no target at a segment start) keeps it out of the loss."""
    return [[(tokens, 0 if i % 2 else prompt) for i, (tokens, prompt) in enumerate(docs)]
            for docs in random_blocks(n, BLOCK, seed)]


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A tiny model, a build of 4 blocks (one step of 2 x 2 blocks is an epoch, so each step trains every block
    whatever order a trainer draws them in) and packtrain's own 3 steps on it."""
    root = tmp_path_factory.mktemp("hf")
    model = tiny_model_dir(root / "model")
    write_build(root / "cache", "sql", boundary_blocks(4, 0), boundary_blocks(2, 1), BLOCK, model)
    config = make_config(model, root / "runs", lora={"r": 16, "alpha": 32, "dropout": 0.0}, max_steps=STEPS,
                         **RECIPE_SETTINGS)
    records = [json.loads(line) for line in (run(config, root / "cache") / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r and "eval/loss" not in r]
    return {"root": root, "model": model, "cache": root / "cache", "losses": [r["loss"] for r in steps],
            "grad_norms": [r["grad_norm"] for r in steps]}


def recipe(name: str) -> str:
    """The python block that follows ``<!-- recipe: NAME`` in docs/INTEROP.md."""
    text = (ROOT / "docs" / "INTEROP.md").read_text()
    after = text[text.index(f"<!-- recipe: {name} "):]
    start = after.index("```python\n") + len("```python\n")
    return after[start:after.index("```", start)]


def run_recipe(name: str, project, tmp_path) -> list[dict]:
    """Run the recipe as written with the doc's five settings pointed at the test's build; its log per step."""
    settings = {"MODEL": str(project["model"]), "BUILD": "sql", "CACHE_DIR": str(project["cache"]),
                "OUTPUT_DIR": str(tmp_path / name), "MAX_STEPS": STEPS}
    exec(compile(recipe(name), f"docs/INTEROP.md ({name})", "exec"), settings)
    return [r for r in settings["trainer"].state.log_history if "loss" in r]


@pytest.mark.parametrize("name", ["hf-trainer", "trl-sft"])
def test_a_recipe_trains_with_packtrains_losses(project, tmp_path, name):
    log = run_recipe(name, project, tmp_path)
    assert [r["loss"] for r in log] == pytest.approx(project["losses"], rel=1e-6)
    assert [r["grad_norm"] for r in log] == pytest.approx(project["grad_norms"], rel=1e-6)
    assert project["losses"][2] != pytest.approx(project["losses"][1], rel=1e-6)  # the steps moved the adapter


def test_the_hf_recipe_in_packtrains_block_order_takes_its_steps(tmp_path, monkeypatch):
    """12 blocks, 3 steps of 2 x 2 blocks an epoch: HF Trainer, given packtrain's permutation instead of its own
    shuffle, trains each step on the blocks packtrain's step trains, with its losses."""
    import transformers
    from torch.utils.data import SequentialSampler

    import packtrain.hf
    from packtrain.trainer.data.epochs import BlockSampler

    model = tiny_model_dir(tmp_path / "model")
    build_id = write_build(tmp_path / "cache", "sql", boundary_blocks(12, 2), boundary_blocks(2, 3), BLOCK, model)
    config = make_config(model, tmp_path / "runs", lora={"r": 16, "alpha": 32, "dropout": 0.0}, max_steps=STEPS,
                         **RECIPE_SETTINGS)
    records = [json.loads(line) for line in (run(config, tmp_path / "cache") / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if "loss" in r and "eval/loss" not in r]
    order = BlockSampler(12, RECIPE_SETTINGS["seed"], build_id).order(0).tolist()
    monkeypatch.setattr(packtrain.hf, "load_build", lambda *a, **k: load_build(*a, **k).select(order))
    monkeypatch.setattr(transformers.Trainer, "_get_train_sampler", lambda self, data=None: SequentialSampler(data))
    log = run_recipe("hf-trainer", {"model": model, "cache": tmp_path / "cache"}, tmp_path)
    assert [r["loss"] for r in log] == pytest.approx(losses, rel=1e-6)
    assert len(set(round(loss, 3) for loss in losses)) == 3


def test_a_row_is_what_packtrains_trainer_trains_on(project):
    dataset = load_build("sql", cache_dir=project["cache"])
    build_dir = resolve_build(project["cache"], "sql")
    items = BlockDataset(build_dir, Manifest.load(build_dir), "train")
    assert len(dataset) == len(items) == 4
    starts_in = 0
    for row, item in zip(dataset, items):
        for column in ("input_ids", "labels", "position_ids"):
            assert np.asarray(row[column]).tolist() == item[column].tolist()
        starts_in += int(((np.asarray(row["position_ids"]) == 0)[1:] & (np.asarray(row["input_ids"])[1:] > 3)).sum())
    assert starts_in > 0  # the blocks do hold documents after the first


def test_a_build_is_found_by_expert_directory_or_environment(project, monkeypatch):
    build_dir = resolve_build(project["cache"], "sql")
    monkeypatch.setenv("PACKTRAIN_CACHE_DIR", str(project["cache"]))
    for where in ("sql", project["cache"] / "sql", build_dir, str(build_dir)):
        dataset = load_build(where, split="val")
        assert len(dataset) == 2 and dataset.info.description.startswith(f"packtrain build {build_dir.name} of 'sql'")


def test_a_row_literally(tmp_path):
    """Block of 10: a document of 6 (prompt 3), one of 3 with no prompt (its first token masked in), padding."""
    model = tiny_model_dir(tmp_path / "model", weights=False)
    write_build(tmp_path / "cache", "sql", [[([11, 12, 13, 14, 15, 0], 3), ([16, 17, 0], 0)]], [], 10, model)
    row = load_build("sql", cache_dir=tmp_path / "cache")[0]
    assert row["input_ids"].tolist() == [11, 12, 13, 14, 15, 0, 16, 17, 0, 3]
    assert row["labels"].tolist() == [-100, -100, -100, 14, 15, 0, -100, 17, 0, -100]
    assert row["position_ids"].tolist() == [0, 1, 2, 3, 4, 5, 0, 1, 2, 0]


def mapped_ranges(directory: Path) -> list[tuple[int, int]]:
    ranges = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5].startswith(str(directory)):
            low, high = (int(x, 16) for x in fields[0].split("-"))
            ranges.append((low, high))
    return ranges


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads the process's mappings (Linux)")
def test_the_dataset_is_the_mapped_shards_and_writes_nothing(project):
    build_dir = resolve_build(project["cache"], "sql")
    files = sorted(p.name for p in build_dir.iterdir())
    dataset = load_build(build_dir)
    ranges = mapped_ranges(build_dir)
    buffers = [buffer for column in ("input_ids", "loss_mask") for chunk in dataset.data.table.column(column).chunks
               for buffer in chunk.values.buffers() if buffer is not None]
    assert buffers and ranges
    assert all(any(low <= b.address and b.address + b.size <= high for low, high in ranges) for b in buffers)
    _ = [dataset.shuffle(seed=0)[0], dataset.select([3, 1])[1], dataset.train_test_split(test_size=2)["test"][0]]
    assert sorted(p.name for p in build_dir.iterdir()) == files


def test_the_collator_keeps_the_documents_apart():
    rows = [{"input_ids": np.arange(6), "labels": np.array([-100, 1, 2, -100, 4, -100]),
             "position_ids": np.array([0, 1, 2, 0, 1, 0])},
            {"input_ids": np.arange(6, 12), "labels": np.full(6, -100), "position_ids": np.arange(6)}]
    batch = PackedCollator()(rows)
    assert batch["input_ids"].tolist() == [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 4, 5]]
    assert batch["labels"][0].tolist() == [-100, 1, 2, -100, 4, -100]
    assert batch["cu_seq_lens_q"].tolist() == batch["cu_seq_lens_k"].tolist() == [0, 3, 5, 6, 12]
    assert str(batch["cu_seq_lens_q"].dtype) == "torch.int32"
    assert (batch["max_length_q"], batch["max_length_k"]) == (6, 6)
    assert "attention_mask" not in batch and "packed_seq_lengths" not in batch
    flat = PackedCollator(flatten=True, seq_lengths=True)(rows)
    assert flat["position_ids"].tolist() == [[0, 1, 2, 0, 1, 0, 0, 1, 2, 3, 4, 5]]
    assert flat["input_ids"].shape == flat["labels"].shape == (1, 12)
    assert flat["cu_seq_lens_q"].tolist() == [0, 3, 5, 6, 12] and flat["packed_seq_lengths"].tolist() == [3, 2, 1, 6]


def one_line_error(call) -> str:
    with pytest.raises(PacktrainError) as caught:
        call()
    assert "\n" not in str(caught.value)
    return str(caught.value)


def test_refusals_are_one_line(project, tmp_path):
    cache = project["cache"]
    assert "no build for expert 'json'" in one_line_error(lambda: load_build("json", cache_dir=cache))
    assert "packtrain pretokenize json" in one_line_error(lambda: load_build("json", cache_dir=cache))
    assert "unknown split 'test'" in one_line_error(lambda: load_build("sql", split="test", cache_dir=cache))
    write_build(tmp_path / "cache", "noval", boundary_blocks(2, 0), [], BLOCK, project["model"])
    assert "has no val blocks" in one_line_error(lambda: load_build("noval", split="val", cache_dir=tmp_path / "cache"))
    older = tmp_path / "older"
    shutil.copytree(resolve_build(cache, "sql"), older)
    manifest = json.loads((older / MANIFEST).read_text())
    (older / MANIFEST).write_text(json.dumps({**manifest, "format_version": 2}))
    assert "format_version 2, this packtrain reads 1" in one_line_error(lambda: load_build(older))
    manifest["inputs"]["pack"]["block_size"] = 16  # shards of 32-token blocks under a manifest of 16
    (older / MANIFEST).write_text(json.dumps(manifest))
    assert "does not hold packtrain's blocks of fixed_size_list<item: uint16>[16]" in one_line_error(
        lambda: load_build(older))
    assert "neither a build directory" in one_line_error(lambda: load_build(tmp_path))
    cut = tmp_path / "cut"
    shutil.copytree(resolve_build(cache, "sql"), cut)
    shard = cut / "train-00000.arrow"
    shard.write_bytes(shard.read_bytes()[:-8])
    assert "the file is truncated or corrupt" in one_line_error(lambda: load_build(cut))
    stripped = load_build("sql", cache_dir=cache).remove_columns(["loss_mask", "doc_lens"])
    assert "remove_unused_columns=False" in one_line_error(lambda: stripped[0])
    assert "give it the dataset packtrain.hf.load_build returns" in one_line_error(
        lambda: PackedCollator()([{"input_ids": [1, 2]}]))
