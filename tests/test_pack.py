"""Packing is a pure function: literal inputs, literal outputs."""

import doctest
import random

import numpy as np
import pytest

import packtrain.pipeline.pack.pack
from packtrain.pipeline.pack.pack import assemble_block, pack, pack_bfd, pack_flat, pack_wrap, plan_pieces


def whole(lengths):
    return [(i, 0, n) for i, n in enumerate(lengths)]


def test_docstring_examples():
    assert doctest.testmod(packtrain.pipeline.pack.pack).failed == 0


def test_bfd_places_each_piece_in_the_fullest_block_that_fits():
    # sorted: 7(d0) 6(d2) 5(d5) 3(d3) 2(d1) 1(d4)
    # 7 -> new b0 (free 1); 6 -> new b1 (free 2); 5 -> new b2 (free 3)
    # 3 -> b2 (free 3 -> 0); 2 -> b1 (2 -> 0); 1 -> b0 (1 -> 0)
    blocks = pack_bfd(whole([7, 2, 6, 3, 1, 5]), 8)
    assert blocks == [
        [(0, 0, 7), (4, 0, 1)],
        [(2, 0, 6), (1, 0, 2)],
        [(5, 0, 5), (3, 0, 3)],
    ]


def test_bfd_ties_go_to_the_block_that_has_had_the_free_space_longest():
    assert pack_bfd(whole([4, 4, 4, 4, 2, 2]), 10) == [
        [(0, 0, 4), (1, 0, 4), (4, 0, 2)],
        [(2, 0, 4), (3, 0, 4), (5, 0, 2)],
    ]
    # 6 -> block 0 (3 free), 4 -> block 1 (5 free), 4 -> block 1 (1 free), 2 -> block 0 (1 free, after
    # block 1): the 1 goes into block 1, as TRL's bfd puts it (not into block 0, the older block)
    assert pack_bfd(whole([4, 6, 1, 4, 2]), 9) == [[(1, 0, 6), (4, 0, 2)], [(0, 0, 4), (3, 0, 4), (2, 0, 1)]]


def test_bfd_makes_the_blocks_trl_pack_dataset_makes():
    """TRL's ``pack_dataset(strategy="bfd")`` (the reference packer) of the same lengths, all in one
    map batch (TRL packs each batch of ``map_kwargs["batch_size"]`` rows, 1,000 by default, on its own;
    packtrain packs a split whole): the same documents in the same blocks, in the same order (pieces
    are whole documents here; packtrain's ``pack.overlong`` cuts longer ones before packing)."""
    import datasets
    from trl import pack_dataset

    rng = random.Random(3)
    for block_size, top, n in ((9, 9, 40), (16, 16, 300), (64, 40, 600), (2048, 2048, 400), (2048, 300, 2000)):
        lengths = [rng.randint(1, top) for _ in range(n)]
        rows = datasets.Dataset.from_dict({"input_ids": [[k] * size for k, size in enumerate(lengths)]})
        packed = pack_dataset(rows, block_size, strategy="bfd", map_kwargs={"batch_size": n})
        theirs = [[ids[at] for at in np.cumsum([0] + sizes[:-1])]  # each document's first token: its index
                  for ids, sizes in zip(packed["input_ids"], packed["seq_lengths"])]
        ours = [[doc for doc, _, _ in block] for block in pack_bfd(whole(lengths), block_size)]
        assert ours == theirs, (block_size, top, n)


def test_bfd_invariants_on_random_lengths():
    rng = random.Random(0)
    lengths = [rng.randint(1, 64) for _ in range(2000)]
    blocks = pack_bfd(whole(lengths), 64)
    placed = sorted(piece for block in blocks for piece in block)
    assert placed == whole(lengths)
    assert all(sum(stop - start for _, start, stop in b) <= 64 for b in blocks)
    # best-fit decreasing is within 11/9 OPT + 1; the lower bound is ceil(total / 64)
    lower = -(-sum(lengths) // 64)
    assert lower <= len(blocks) <= 11 * lower // 9 + 1


def best_fit_by_scanning(pieces, block_size):
    """Best-fit decreasing written the plain way: every open block scanned for each piece."""
    blocks, free, since = [], [], []  # since: when (which placing) the block got its free space
    for placing, piece in enumerate(sorted(pieces, key=lambda p: -(p[2] - p[1]))):  # stable: ties in input order
        size = piece[2] - piece[1]
        fits = [b for b in range(len(blocks)) if free[b] >= size]
        if fits:
            b = min(fits, key=lambda b: (free[b], since[b]))  # least free space, then had it longest
        else:
            b = len(blocks)
            blocks.append([])
            free.append(block_size)
            since.append(placing)
        blocks[b].append(piece)
        free[b] -= size
        since[b] = placing
    return blocks


def test_bfd_is_best_fit_decreasing_written_the_plain_way():
    rng = random.Random(1)
    for block_size, top in ((16, 16), (64, 40), (2048, 700)):  # many ties, then many free-space values
        pieces = whole([rng.randint(1, top) for _ in range(600)])
        assert pack_bfd(pieces, block_size) == best_fit_by_scanning(pieces, block_size)


def test_pack_flat_is_pack_as_arrays():
    # the header's example: B alone, then C and A
    pieces, per_block, counts = pack_flat(np.array([3, 6, 4]), np.array([1, 2, 2]), 8)
    assert (pieces.tolist(), per_block.tolist(), counts.documents) == ([[1, 0, 6], [2, 0, 4], [0, 0, 3]], [1, 2], 3)
    pieces, per_block, counts = pack_flat([6, 5, 1], [0, 0, 0], 4, "wrap")
    assert (pieces.tolist(), per_block.tolist(), counts) == ([[0, 0, 4], [0, 4, 6], [1, 0, 2], [1, 2, 5], [2, 0, 1]],
                                                              [1, 2, 2], None)
    assert [a.tolist() for a in pack_flat([], [], 8)[:2]] == [[], []]
    rng = random.Random(2)
    lengths = [rng.randint(1, 40) for _ in range(500)]
    prompts = [rng.randint(0, n) for n in lengths]
    for strategy in ("bfd", "wrap"):
        pieces, per_block, _ = pack_flat(lengths, prompts, 16, strategy, "split")
        blocks = pack(lengths, prompts, 16, strategy, "split")[0]
        assert per_block.tolist() == [len(b) for b in blocks]
        assert pieces.tolist() == [list(p) for b in blocks for p in b]


def test_bfd_rejects_pieces_longer_than_a_block():
    with pytest.raises(ValueError, match="plan_pieces first"):
        pack_bfd([(0, 0, 9)], 8)


def test_wrap_cuts_across_documents_and_keeps_the_last_partial_block():
    assert pack_wrap([6, 5, 1], 4) == [
        [(0, 0, 4)],
        [(0, 4, 6), (1, 0, 2)],
        [(1, 2, 5), (2, 0, 1)],
    ]
    assert pack_wrap([], 4) == []


def test_plan_pieces_split_truncate_drop_with_counts():
    lengths, prompts = [5, 19, 3, 20], [2, 4, 1, 17]
    pieces, counts = plan_pieces(lengths, prompts, 8, "split")
    # doc 3 splits into [0:8] and [8:16] (all prompt: dropped) and [16:20]
    assert pieces == [(0, 0, 5), (1, 0, 8), (1, 8, 16), (1, 16, 19), (2, 0, 3), (3, 16, 20)]
    assert (counts.documents, counts.overlong, counts.split, counts.dropped_unsupervised) == (4, 2, 2, 2)
    assert counts.tokens_lost == 16

    pieces, counts = plan_pieces(lengths, prompts, 8, "truncate")
    assert pieces == [(0, 0, 5), (1, 0, 8), (2, 0, 3)]
    assert (counts.truncated, counts.dropped_unsupervised, counts.tokens_lost) == (2, 1, 11 + 12 + 8)

    pieces, counts = plan_pieces(lengths, prompts, 8, "drop")
    assert pieces == [(0, 0, 5), (2, 0, 3)]
    assert (counts.dropped_overlong, counts.tokens_lost) == (2, 39)
    assert counts.examples == {"dropped_overlong": [1, 3]}


def test_plan_pieces_drops_a_document_whose_only_target_is_its_first_token():
    # prompt length 0 and a single token: the first token of a piece is never a target
    pieces, counts = plan_pieces([1, 2], [0, 0], 8)
    assert pieces == [(1, 0, 2)]
    assert counts.dropped_unsupervised == 1


def test_assemble_block_masks_prompts_piece_starts_and_padding():
    tokens = [np.array([10, 11, 12, 13]), np.array([20, 21, 22]), np.array([30, 31, 32, 33, 34])]
    masks = [np.array([0, 0, 1, 1]), np.array([0, 1, 1]), np.array([1, 1, 1, 1, 1])]  # prompts of 2, 1 and 0
    ids, mask, lens = assemble_block([(0, 0, 4), (1, 0, 3), (2, 3, 5)], tokens, masks, 12, pad_id=99,
                                     dtype=np.dtype(np.uint16))
    assert ids.dtype == np.uint16
    assert ids.tolist() == [10, 11, 12, 13, 20, 21, 22, 33, 34, 99, 99, 99]
    assert mask.tolist() == [0, 0, 1, 1, 0, 1, 1, 0, 1, 0, 0, 0]
    assert lens == [4, 3, 2]
