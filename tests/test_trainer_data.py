"""trainer/data.py: blocks read from hand-written shards, the resumable sampler, the loader."""

from __future__ import annotations

import pytest
import torch

from packtrain.core.config_train import TrainConfig
from packtrain.core.contract import Manifest, expert_dir
from packtrain.core.errors import ContractError
from packtrain.trainer.data import (IGNORE_INDEX, BatchStream, BlockDataset, BlockSampler, make_loader,
                          position_ids_from_doc_lens)
from trainer_fixtures import pack_docs, random_blocks, write_build, write_tokenizer

BUILD = "0123456789abcdef"


def open_build(cache, build_id, split="train"):
    build_dir = expert_dir(cache, "sql") / build_id
    return BlockDataset(build_dir, Manifest.load(build_dir), split)


def test_position_ids_restart_per_document_and_for_padding():
    assert position_ids_from_doc_lens([3, 2], 7).tolist() == [0, 1, 2, 0, 1, 0, 1]
    assert position_ids_from_doc_lens([4], 4).tolist() == [0, 1, 2, 3]
    assert position_ids_from_doc_lens([], 3).tolist() == [0, 1, 2]
    with pytest.raises(ContractError, match="sum to more than block_size"):
        position_ids_from_doc_lens([3, 3], 5)


def test_item_labels_positions_and_counts(tmp_path):
    tok = write_tokenizer(tmp_path / "tok")
    # doc 1: prompt 10 11 12, answer 13 EOS; doc 2: prompt 20, answer 21 EOS; 2 pad tokens
    # doc 3 (block 2) has prompt length 0: its first token is masked 1 but can never be a target
    block1 = [([10, 11, 12, 13, 0], 3), ([20, 21, 0], 1)]
    block2 = [([30, 31, 0], 1), ([40, 41, 0], 0)]
    build_id = write_build(tmp_path / "cache", "sql", [block1, block2], [], block_size=10, tokenizer_dir=tok)
    ds = open_build(tmp_path / "cache", build_id)
    assert len(ds) == 2
    item = ds[0]
    _ = IGNORE_INDEX
    assert item["input_ids"].tolist() == [10, 11, 12, 13, 0, 20, 21, 0, 3, 3]
    assert item["position_ids"].tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 0, 1]
    assert item["labels"].tolist() == [_, _, _, 13, 0, _, 21, 0, _, _]
    assert item["input_ids"].dtype == item["labels"].dtype == item["position_ids"].dtype == torch.int64
    assert (item["n_tokens"].item(), item["n_sup"].item(), item["attn_pairs"].item()) == (8, 4, 15 + 6)
    second = ds[1]
    assert second["labels"].tolist() == [_, 31, 0, _, 41, 0, _, _, _, _]  # 40 starts a document
    assert second["n_sup"].item() == 4


def test_rows_across_shards_and_record_batches(tmp_path):
    tok = write_tokenizer(tmp_path / "tok")
    blocks = random_blocks(12, 32, seed=3)
    build_id = write_build(tmp_path / "cache", "sql", blocks, blocks[:2], block_size=32, tokenizer_dir=tok,
                           rows_per_shard=5, rows_per_batch=2)
    ds = open_build(tmp_path / "cache", build_id)
    assert len(ds.paths) == 3 and len(ds) == 12
    for i in (11, 0, 4, 5, 6, 9):  # any order: shards open lazily
        ids, mask, lens = pack_docs(blocks[i], 32)
        assert ds[i]["input_ids"].tolist() == ids.tolist()
        assert ds[i]["n_tokens"].item() == sum(lens)
    assert len(open_build(tmp_path / "cache", build_id, "val")) == 2
    with pytest.raises(IndexError):
        ds[12]


def test_dataset_stores_only_paths_until_read(tmp_path):
    tok = write_tokenizer(tmp_path / "tok")
    build_id = write_build(tmp_path / "cache", "sql", random_blocks(3, 16, 0), [], 16, tok)
    ds = open_build(tmp_path / "cache", build_id)
    assert ds._open == {}
    ds[0]
    assert list(ds._open) == [0]


def test_corrupt_shard_names_the_file(tmp_path):
    tok = write_tokenizer(tmp_path / "tok")
    build_id = write_build(tmp_path / "cache", "sql", random_blocks(3, 16, 0), [], 16, tok)
    ds = open_build(tmp_path / "cache", build_id)
    ds.paths[0].write_bytes(b"not arrow at all" * 10)
    with pytest.raises(ContractError, match="train-00000.arrow"):
        ds[0]


def test_sampler_permutation_is_pinned_and_resumable():
    sampler = BlockSampler(10, seed=42, build_id=BUILD)
    assert sampler.order(0).tolist() == [5, 6, 8, 3, 9, 4, 0, 2, 7, 1]
    assert sampler.order(1).tolist() == [7, 8, 6, 0, 3, 2, 5, 9, 4, 1]
    assert list(sampler) == [5, 6, 8, 3, 9, 4, 0, 2, 7, 1]
    sampler.set_position(1, 4)
    assert list(sampler) == [3, 2, 5, 9, 4, 1] and len(sampler) == 6
    # another seed or build gives another order
    assert BlockSampler(10, 43, BUILD).order(0).tolist() != sampler.order(0).tolist()
    assert BlockSampler(10, 42, "fedcba9876543210").order(0).tolist() != sampler.order(0).tolist()


def test_sampler_rank_slices_are_disjoint_and_equal():
    slices = [BlockSampler(10, 42, BUILD, rank=r, world_size=3).order(0).tolist() for r in range(3)]
    assert slices[1] == [6, 9, 2]
    assert all(len(s) == 3 for s in slices)
    assert len(set(sum(slices, []))) == 9


def test_loader_with_two_persistent_workers_streams_epochs_and_resumes(tmp_path):
    tok = write_tokenizer(tmp_path / "tok")
    blocks = random_blocks(7, 16, seed=5)
    build_id = write_build(tmp_path / "cache", "sql", blocks, [], 16, tok, rows_per_shard=3)
    ds = open_build(tmp_path / "cache", build_id)
    train = TrainConfig(dataloader_num_workers=2, dataloader_prefetch_factor=2, dataloader_persistent_workers=True)
    first = {tuple(pack_docs(b, 16)[0].tolist()): i for i, b in enumerate(blocks)}

    def stream(epoch, position):
        sampler = BlockSampler(len(ds), 1, build_id)
        loader = make_loader(ds, sampler, 2, train, torch.device("cpu"), drop_last=True, seed=1)
        assert loader.persistent_workers and loader.num_workers == 2
        return sampler, BatchStream(loader, sampler, epoch, position)

    sampler, batches = stream(0, 0)
    seen, positions = [], []
    for _ in range(7):  # 3 batches per epoch (7 blocks, drop_last): crosses two epoch boundaries
        batch = next(batches)
        seen += [first[tuple(row.tolist())] for row in batch["input_ids"]]
        positions.append((batches.epoch, batches.position))
    expected = sampler.order(0)[:6].tolist() + sampler.order(1)[:6].tolist() + sampler.order(2)[:2].tolist()
    assert seen == expected
    assert positions == [(0, 2), (0, 4), (0, 6), (1, 2), (1, 4), (1, 6), (2, 2)]

    _, resumed = stream(1, 4)  # jump straight to epoch 1, block 4
    tail = []
    for _ in range(2):
        tail += [first[tuple(row.tolist())] for row in next(resumed)["input_ids"]]
    assert tail == seen[10:14]
    assert (resumed.epoch, resumed.position) == (2, 2)
