"""trainer/data/data.py: blocks read from hand-written shards, the resumable sampler, the loader."""

from __future__ import annotations

import pytest
import torch

from packtrain.core.config_train import TrainConfig
from packtrain.core.contract import Manifest, expert_dir
from packtrain.core.errors import ContractError
from packtrain.trainer.data.data import (IGNORE_INDEX, PAD, BatchStream, BlockDataset, BlockSampler, PaddedBlocks,
                                    make_loader, position_ids_from_doc_lens, window_doc_lens)
from trainer_fixtures import pack_docs, random_blocks, write_build, write_tokenizer

BUILD = "0123456789abcdef"


def open_build(cache, build_id, split="train", seq_length=None):
    build_dir = expert_dir(cache, "sql") / build_id
    return BlockDataset(build_dir, Manifest.load(build_dir), split, seq_length)


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


def test_a_block_cut_into_windows_splits_documents_positions_and_the_loss_mask(tmp_path):
    """train.max_seq_length 512 on a 2048-token block of documents [700, 1348]: four windows, each its own
    sequence; a document cut at an edge restarts its positions and its first token there is no target."""
    tok = write_tokenizer(tmp_path / "tok")
    a = ([4 + i % 200 for i in range(700)], 600)  # prompt 600 tokens, answer 100 (block positions 600..699)
    b = ([4 + i % 250 for i in range(1348)], 100)  # prompt 100 tokens (block positions 700..799), answer 1248
    build_id = write_build(tmp_path / "cache", "sql", [[a, b]], [], block_size=2048, tokenizer_dir=tok)
    whole, windows = open_build(tmp_path / "cache", build_id), open_build(tmp_path / "cache", build_id, seq_length=512)
    assert (len(whole), len(windows), windows.seq_length, windows.windows) == (1, 4, 512, 4)
    assert window_doc_lens([700, 1348], 2048, 512) == [[512], [188, 324], [512], [512]]

    items = [windows[i] for i in range(4)]
    assert [item["seq_lens"].tolist() for item in items] == [[512], [188, 324], [512], [512]]
    assert torch.equal(torch.cat([item["input_ids"] for item in items]), whole[0]["input_ids"])
    assert [item["position_ids"][[0, 1, 187, 188, 511]].tolist() for item in items] == [
        [0, 1, 187, 188, 511], [0, 1, 187, 0, 323], [0, 1, 187, 188, 511], [0, 1, 187, 188, 511]]
    _ = IGNORE_INDEX
    labels = [item["labels"] for item in items]
    assert labels[0].eq(_).all()  # a's prompt only
    assert labels[1][:88].eq(_).all() and labels[1][88:188].tolist() == a[0][600:700]  # a's answer
    assert labels[1][188:288].eq(_).all() and labels[1][288:].tolist() == b[0][100:324]  # b's prompt, answer
    assert labels[2][0] == _ and labels[2][1:].tolist() == b[0][325:836]  # b goes on: its first token here is no target
    assert labels[3][0] == _ and labels[3][1:].tolist() == b[0][837:1348]
    assert [(i["n_tokens"].item(), i["n_sup"].item()) for i in items] == [(512, 0), (512, 324), (512, 511), (512, 511)]
    assert whole[0]["n_sup"].item() == 1348  # the two cut first tokens are the difference
    assert [i["attn_pairs"].item() for i in items] == [512 * 513 // 2, 188 * 189 // 2 + 324 * 325 // 2,
                                                       512 * 513 // 2, 512 * 513 // 2]


def test_the_last_window_is_padded_and_windows_of_padding_only_are_left_out(tmp_path):
    tok = write_tokenizer(tmp_path / "tok")
    first = [([10, 11, 12], 1), ([20, 21, 22, 23, 24, 0], 2)]  # 9 tokens of 10, then 1 padding token (3)
    second = [([30, 31, 32], 1)]  # 3 tokens, then 7 padding: its windows 1 and 2 hold no document
    build_id = write_build(tmp_path / "cache", "sql", [first, second], [], block_size=10, tokenizer_dir=tok)
    windows = open_build(tmp_path / "cache", build_id, seq_length=4)
    assert len(windows) == 4 and windows._open == {}  # 3 windows of the first block, 1 of the second
    items = [windows[i] for i in range(4)]
    _ = IGNORE_INDEX
    assert [i["input_ids"].tolist() for i in items] == [[10, 11, 12, 20], [21, 22, 23, 24], [0, 3, 0, 0],
                                                        [30, 31, 32, 3]]
    assert [i["seq_lens"].tolist() for i in items] == [[3, 1], [4], [1, 3], [3, 1]]
    assert [i["position_ids"].tolist() for i in items] == [[0, 1, 2, 0], [0, 1, 2, 3], [0, 0, 1, 2], [0, 1, 2, 0]]
    assert [i["labels"].tolist() for i in items] == [[_, 11, 12, _], [_, 22, 23, 24], [_, _, _, _], [_, 31, 32, _]]
    with pytest.raises(IndexError, match="window 4 out of range"):
        windows[4]
    assert open_build(tmp_path / "cache", build_id, seq_length=64).windows == 1  # longer than the block: whole


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


def test_sampler_rank_slices_are_disjoint_equal_and_cover_every_block():
    """10 blocks over 3 ranks: every block once, the slices padded to 4 each (PAD trains nothing)."""
    slices = [BlockSampler(10, 42, BUILD, rank=r, world_size=3).order(0).tolist() for r in range(3)]
    assert slices[1] == [6, 9, 2, PAD]
    assert all(len(s) == 4 for s in slices)
    assert sorted(sum(slices, [])) == [PAD, PAD] + list(range(10))


def test_loader_with_two_persistent_workers_streams_epochs_and_resumes(tmp_path):
    """7 blocks in micro-batches of 2: 4 an epoch (the last: 1 block and padding); windows of 3 micro-batches
    stop at every epoch's end, as HF Trainer's last step of an epoch takes the leftovers."""
    tok = write_tokenizer(tmp_path / "tok")
    blocks = random_blocks(7, 16, seed=5)
    build_id = write_build(tmp_path / "cache", "sql", blocks, [], 16, tok, rows_per_shard=3)
    ds = open_build(tmp_path / "cache", build_id)
    train = TrainConfig(dataloader_num_workers=2, dataloader_prefetch_factor=2, dataloader_persistent_workers=True)
    first = {tuple(pack_docs(b, 16)[0].tolist()): i for i, b in enumerate(blocks)}

    def stream(epoch, position):
        sampler = BlockSampler(len(ds), 1, build_id, batch_size=2)
        loader = make_loader(PaddedBlocks(ds), sampler, 2, train, torch.device("cpu"), drop_last=True, seed=1)
        assert loader.persistent_workers and loader.num_workers == 2
        return sampler, BatchStream(loader, sampler, epoch, position)

    def blocks_of(window):
        return [first[tuple(ids.tolist())] if int(n) else PAD
                for batch in window for ids, n in zip(batch["input_ids"], batch["n_tokens"])]

    sampler, batches = stream(0, 0)
    seen, sizes, positions = [], [], []
    for _ in range(5):  # crosses two epoch boundaries
        window = batches.window(3)
        seen += blocks_of(window)
        sizes.append(len(window))
        positions.append((batches.epoch, batches.position))
    assert sizes == [3, 1, 3, 1, 3]
    assert seen == sampler.order(0).tolist() + sampler.order(1).tolist() + sampler.order(2)[:6].tolist()
    assert seen[6:8] == [sampler.order(0)[6], PAD]
    assert positions == [(0, 6), (1, 0), (1, 6), (2, 0), (2, 6)]

    _, resumed = stream(1, 6)  # jump straight to epoch 1, block 6: the epoch's last micro-batch
    assert blocks_of(resumed.window(3)) == seen[14:16]
    assert (resumed.epoch, resumed.position) == (2, 0)
    assert blocks_of(resumed.window(3)) == seen[16:22]
