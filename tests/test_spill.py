"""The source spill (pipeline/pack/spill.py) and the vectorized steps around it: literal outputs."""

from __future__ import annotations

import dataclasses
import doctest
import json

import numpy as np
import pytest

import packtrain.pipeline.encode.assemble
import packtrain.pipeline.encode.splits
import packtrain.pipeline.encode.worker
import packtrain.pipeline.format.format_columns
from packtrain.pipeline.pack import mix
from packtrain.pipeline.pack.pack import assemble_block
from packtrain.pipeline.pack.shards import (DocumentView, assemble_blocks, assemble_pieces, cut_piece_list, cut_pieces,
                                            packed_lengths)
from packtrain.pipeline.pack.source_stats import Exactness, SourceStats
from packtrain.pipeline.pack.spill import SOURCE_STATS, SourceSpill, SpillWriter, merge_spills, source_cache_problem
from packtrain.pipeline.pack.spill_batches import INCOMING, write_batch_files
from packtrain.pipeline.encode.assemble import assemble_documents, assemble_suffixes

STATS = SourceStats(2, Exactness("tokenizers", line_cache=False, render_once=False), rows=3, documents=3, tokens=9,
                    batches=2)


def test_tokenize_docstring_examples_hold():
    results = [doctest.testmod(module) for module in (packtrain.pipeline.encode.worker, packtrain.pipeline.encode.splits,
                                                      packtrain.pipeline.encode.assemble,
                                                      packtrain.pipeline.format.format_columns)]
    assert [(r.failed, r.attempted) for r in results] == [(0, 1), (0, 3), (0, 10), (0, 3)]


def test_assemble_documents_adds_head_and_eos_and_masks_the_spans():
    # doc 0: answer to the end, no EOS yet -> EOS added and supervised; doc 1 ends with EOS already;
    # doc 2: two turns (a conversation), the last not at the end -> EOS added, not supervised
    batch = assemble_documents([(np.array([5, 6, 7], np.uint32), [(1, 3)]),
                                (np.array([8, 9, 2], np.uint32), [(1, 3)]),
                                (np.array([3, 4, 5, 6], np.uint32), [(0, 1), (2, 3)])],
                               [True, True, False], head=(1,), eos_id=2)
    assert batch["tokens"].tolist() == [1, 5, 6, 7, 2, 1, 8, 9, 2, 1, 3, 4, 5, 6, 2]
    assert batch["masks"].tolist() == [0, 0, 1, 1, 1, 0, 0, 1, 1, 0, 1, 0, 1, 0, 0]
    assert batch["lengths"].tolist() == [5, 4, 6]
    assert batch["prompt_lengths"].tolist() == [2, 2, 1]
    assert batch["tokens"].dtype == np.uint32 and batch["masks"].dtype == np.uint8


def test_assemble_documents_of_no_document():
    batch = assemble_documents([], [], head=(), eos_id=2)
    assert [len(batch[k]) for k in ("tokens", "masks", "lengths", "prompt_lengths")] == [0, 0, 0, 0]


def test_assemble_suffixes_is_assemble_documents_for_prompt_answer_documents():
    # doc 0: no EOS yet (added, supervised); doc 1 ends with EOS; doc 2 all answer; doc 3 no token at all
    ids = np.array([5, 6, 7, 8, 9, 2, 3, 4], np.uint32)
    offsets, firsts = np.array([0, 3, 6, 8, 8]), np.array([1, 1, 0, 0])
    for head in ((1,), (), (1, 4)):
        batch = assemble_suffixes(ids, offsets, firsts, head, eos_id=2)
        want = assemble_documents([(ids[a:b], [(f, b - a)]) for a, b, f in zip(offsets[:-1], offsets[1:], firsts)],
                                  [True] * 4, head, eos_id=2)
        assert {k: v.tolist() for k, v in batch.items()} == {k: v.tolist() for k, v in want.items()}
        assert batch["tokens"].dtype == np.uint32 and batch["masks"].dtype == np.uint8
    assert batch["tokens"].tolist() == [1, 4, 5, 6, 7, 2, 1, 4, 8, 9, 2, 1, 4, 3, 4, 2, 1, 4, 2]
    assert batch["masks"].tolist() == [0, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 0, 0, 1]
    assert batch["lengths"].tolist() == [6, 5, 5, 3] and batch["prompt_lengths"].tolist() == [3, 3, 2, 2]
    empty = assemble_suffixes(np.zeros(0, np.uint32), np.array([0]), np.zeros(0, np.int64), (1,), eos_id=2)
    assert [len(empty[k]) for k in ("tokens", "masks", "lengths", "prompt_lengths")] == [0, 0, 0, 0]


def write_spill(directory, batches, through_files=False):
    """batches: (number, tokens, masks, lengths, prompt lengths, is_val). ``through_files``: each batch's
    arrays written as a worker does (write_batch_files), then appended (add_batch_files)."""
    writer = SpillWriter(directory, np.uint16)
    try:
        for number, tokens, masks, lengths, prompts, is_val in batches:
            tokens, masks, lengths = np.array(tokens, np.uint16), np.array(masks, np.uint8), np.array(lengths, np.int64)
            prompts, is_val, keys = np.array(prompts, np.int64), np.array(is_val, bool), mix.document_keys(tokens, masks, lengths)
            if through_files:
                write_batch_files(writer.incoming(number), tokens, masks, lengths, is_val, keys)
                writer.add_batch_files(number, lengths, prompts, is_val)
            else:
                writer.add_batch(number, tokens, masks, lengths, prompts, is_val, keys)
        writer.close(dataclasses.replace(STATS, batches=4))
    finally:
        writer.abort()


@pytest.mark.parametrize("kernel_copy", ["yes", "ENOSYS", "EPERM", "EXDEV after a part", "copies nothing"])
def test_batches_a_worker_wrote_to_files_make_the_same_spill(tmp_path, monkeypatch, kernel_copy):
    """A worker's batch files, appended in the kernel (or, where copy_file_range is missing or refused,
    through this process), give the bytes the arrays give when written here; none is left. Refused: an old
    kernel (ENOSYS), a container's seccomp filter (EPERM: older Docker, CircleCI, snaps; Go and Rust fall
    back on it too), another file system after part of a file, a file system whose call copies nothing."""
    import errno
    import os

    kernel = os.copy_file_range
    calls = []

    def refused(source, out, count, *more):
        calls.append(count)
        if kernel_copy == "copies nothing":
            return 0
        if kernel_copy == "EXDEV after a part" and len(calls) % 2:
            return kernel(source, out, max(1, count // 2), *more)
        raise OSError(getattr(errno, kernel_copy.split()[0]), "copy_file_range")

    if kernel_copy != "yes":
        monkeypatch.setattr(os, "copy_file_range", refused, raising=False)
    batches = [(0, [7, 8, 9, 4, 5], [0, 1, 1, 0, 1], [3, 2], [1, 1], [False, True]),
               (1, [6, 6, 6, 6], [0, 0, 1, 1], [4], [2], [False]), (2, [1, 2], [0, 1], [2], [1], [True])]
    write_spill(tmp_path / "here", batches)
    write_spill(tmp_path / "files", batches, through_files=True)
    here, files = ({f.name: f.read_bytes() for f in (tmp_path / d).iterdir()} for d in ("here", "files"))
    assert files == here and INCOMING not in files
    assert SourceSpill(tmp_path / "files", "val", np.uint16).tokens.tolist() == [4, 5, 1, 2]
    assert SourceSpill(tmp_path / "files", "train", np.uint16).tokens.tolist() == [7, 8, 9, 6, 6, 6, 6]


@pytest.mark.parametrize("sum_tokens", [1, 2, 4, 1 << 22])
def test_supervised_tokens_are_summed_in_pieces_of_whole_documents(tmp_path, monkeypatch, sum_tokens):
    """Each piece covers whole documents, however small SUM_TOKENS is (a document longer than it is a
    piece of its own); an empty split has none."""
    from packtrain.pipeline.pack import spill

    monkeypatch.setattr(spill, "SUM_TOKENS", sum_tokens)
    write_spill(tmp_path / "s", [(0, [1] * 13, [0, 1, 1, 0, 0, 1, 1, 1, 0, 1, 0, 1, 1], [3, 4, 1, 5], [1, 2, 0, 1],
                                  [False] * 4)])
    assert SourceSpill(tmp_path / "s", "train", np.uint16).supervised().tolist() == [2, 2, 1, 3]
    assert SourceSpill(tmp_path / "s", "val", np.uint16).supervised().tolist() == []


def test_a_spill_reads_back_what_was_written_split_by_is_val(tmp_path):
    write_spill(tmp_path / "s", [(0, [7, 8, 9, 4, 5], [0, 1, 1, 0, 1], [3, 2], [1, 1], [False, True]),
                                 (1, [6, 6, 6, 6], [0, 0, 1, 1], [4], [2], [False])])
    train, val = SourceSpill(tmp_path / "s", "train", np.uint16), SourceSpill(tmp_path / "s", "val", np.uint16)
    assert train.tokens.tolist() == [7, 8, 9, 6, 6, 6, 6] and train.masks.tolist() == [0, 1, 1, 0, 0, 1, 1]
    assert train.lengths.tolist() == [3, 4] and train.prompt_lengths.tolist() == [1, 2]
    assert train.supervised().tolist() == [2, 2]
    assert val.tokens.tolist() == [4, 5] and val.lengths.tolist() == [2]
    assert [a.tolist() for a in train.batch(1)[:4]] == [[6, 6, 6, 6], [0, 0, 1, 1], [4], [2]]
    # each document's key as written, split with its document: [7 8 9] is train, [4 5] val
    assert train.key_rows.tolist() == mix.document_keys(train.tokens, train.masks, train.lengths).tolist()
    assert val.key_rows.tolist() == mix.document_keys(np.array([4, 5], np.uint16), np.array([0, 1], np.uint8),
                                                      np.array([2])).tolist()
    assert np.load(tmp_path / "s" / "batch_index.npy").tolist() == [0, 1]
    assert source_cache_problem(tmp_path / "s") is None
    assert json.loads((tmp_path / "s" / SOURCE_STATS).read_text())["documents"] == 3


def test_merge_interleaves_parts_back_into_batch_order(tmp_path):
    write_spill(tmp_path / "p0", [(0, [1, 2], [0, 1], [2], [1], [False]), (2, [5, 5, 5], [0, 1, 1], [3], [1], [False])])
    write_spill(tmp_path / "p1", [(1, [3, 4], [0, 1], [2], [1], [True]), (3, [6], [1], [1], [0], [False])])
    merge_spills([tmp_path / "p0", tmp_path / "p1"], tmp_path / "out", np.uint16, dataclasses.replace(STATS, batches=4))
    train = SourceSpill(tmp_path / "out", "train", np.uint16)
    assert train.tokens.tolist() == [1, 2, 5, 5, 5, 6] and train.lengths.tolist() == [2, 3, 1]
    assert SourceSpill(tmp_path / "out", "val", np.uint16).tokens.tolist() == [3, 4]
    assert np.load(tmp_path / "out" / "batch_index.npy").tolist() == [0, 1, 2, 3]
    assert np.load(tmp_path / "out" / "train.batch_docs.npy").tolist() == [1, 0, 1, 1]
    assert train.key_rows.tolist() == mix.document_keys(train.tokens, train.masks, train.lengths).tolist()


def test_a_short_spill_file_is_never_completed(tmp_path):
    writer = SpillWriter(tmp_path / "s", np.uint16)
    writer.add_batch(0, np.array([1, 2], np.uint32), np.array([0, 1], np.uint8), np.array([3]), np.array([1]),
                     np.array([False]), np.zeros((1, mix.KEY_BYTES), np.uint8))  # lengths say 3 tokens, 2 were written
    with pytest.raises(OSError, match="has 4 bytes, expected 6"):
        writer.close(STATS)
    writer.abort()
    assert not (tmp_path / "s" / SOURCE_STATS).exists()


def test_assemble_blocks_gives_assemble_blocks_bytes_across_sources(tmp_path):
    write_spill(tmp_path / "a", [(0, [7, 8, 9, 4, 5, 6, 3], [0, 1, 1, 1, 1, 1, 1], [3, 4], [1, 0], [False, False])])
    write_spill(tmp_path / "b", [(0, [11, 12, 13], [0, 0, 1], [3], [2], [False])])
    spills = [SourceSpill(tmp_path / s, "train", np.uint16) for s in ("a", "b")]
    view = DocumentView(spills, [np.array([1, 0]), np.array([0, 0])])  # docs: a1 a0 b0 b0 (b0 twice)
    blocks = [[(0, 0, 3), (1, 1, 3)], [(2, 0, 3), (0, 3, 4)], [(3, 1, 3)]]
    ids, mask, lens = assemble_blocks(blocks, view, 6, pad_id=0, dtype=np.uint16)
    assert ids.tolist() == [[4, 5, 6, 8, 9, 0], [11, 12, 13, 3, 0, 0], [12, 13, 0, 0, 0, 0]]
    assert mask.tolist() == [[0, 1, 1, 0, 1, 0], [0, 0, 1, 0, 0, 0], [0, 1, 0, 0, 0, 0]]
    assert lens == [[3, 2], [3, 1], [2]]
    for row, block in enumerate(blocks):
        one = assemble_block(block, view, view.masks(), 6, 0, np.uint16)
        assert (one[0].tolist(), one[1].tolist(), one[2]) == (ids[row].tolist(), mask[row].tolist(), lens[row])


def test_regular_masks_are_made_from_the_prompt_length_not_read(tmp_path):
    """Once irregular_masks has looked, a document whose loss is on every token after its prompt gets its mask
    made from its prompt length (the spill's mask pages are not read again); an irregular one (two supervised
    runs) is read. Same bytes as reading every mask: here the regular ones' spill masks are spoilt after the look."""
    write_spill(tmp_path / "a", [(0, [7, 8, 9, 4, 5, 6, 3], [0, 1, 1, 0, 1, 0, 1], [3, 4], [1, 1], [False, False])])
    write_spill(tmp_path / "b", [(0, [11, 12, 13], [0, 0, 1], [3], [2], [False])])
    spills = [SourceSpill(tmp_path / s, "train", np.uint16) for s in ("a", "b")]
    selections = [np.array([1, 0]), np.array([0, 0])]  # docs: a1 (irregular) a0 b0 b0
    blocks = [[(0, 0, 4), (1, 1, 3)], [(2, 0, 3), (1, 0, 1), (3, 1, 3)]]
    want = assemble_blocks(blocks, DocumentView(spills, selections), 8, pad_id=0, dtype=np.uint16)
    view = DocumentView(spills, selections)
    lengths, prompts = packed_lengths(spills, selections), np.array([1, 1, 2, 2])
    assert view.irregular_masks(lengths, prompts).docs.tolist() == [0] and view.regular.tolist() == [False, True, True, True]
    spills[0].masks = np.array([0, 0, 0, 0, 1, 0, 1], np.uint8)  # a0's mask spoilt, a1's kept
    spills[1].masks = np.zeros(3, np.uint8)
    ids, mask, lens = assemble_blocks(blocks, view, 8, pad_id=0, dtype=np.uint16)
    assert mask.tolist() == [[0, 1, 0, 1, 0, 1, 0, 0], [0, 0, 1, 0, 0, 1, 0, 0]] == want[1].tolist()
    assert ids.tolist() == want[0].tolist() and lens == want[2] == [[4, 2], [3, 1, 2]]


def plan_reading_every_turn(lengths, prompts, block_size, overlong, masks):
    """The pieces as plan_piece_array made them before conversations were decided from counts: every
    conversation's mask read, one document at a time."""
    out, dropped = [], 0
    for doc, (length, prompt) in enumerate(zip(lengths.tolist(), prompts.tolist())):
        if length > block_size and overlong == "drop":
            continue
        cuts = [(0, length)] if length <= block_size else [(0, block_size)] if overlong == "truncate" else \
            [(s, min(s + block_size, length)) for s in range(0, length, block_size)]
        for a, b in cuts:
            if masks[doc][a + 1 : b].any() if doc in masks else b > max(prompt, a + 1):
                out.append((doc, a, b))
            else:
                dropped += 1
    return out, dropped


@pytest.mark.parametrize("overlong", ["split", "truncate", "drop"])
def test_conversations_that_fit_a_block_are_planned_without_reading_their_masks(tmp_path, monkeypatch, overlong):
    """Packing decides a conversation that fits a block (several supervised runs: its mask is not the prompt's
    length) from its supervised count and its first token's mask, with no mask read per document; a longer one's
    mask is read. The same pieces and counts as reading every conversation's mask, on conversations whose only
    supervised token is the first, and on long ones whose middle piece has none."""
    from packtrain.pipeline.pack import shards
    from packtrain.pipeline.pack.pack import plan_piece_array

    rng = np.random.default_rng(5)
    docs = []
    for k in range(300):
        length = int(rng.integers(2, 30))
        mask = (rng.random(length) < 0.3).astype(np.uint8)
        if k % 7 == 0:
            mask[:] = 0
            mask[0] = 1  # supervised on its first token only: nothing to learn in a block, dropped
        elif k % 11 == 0:
            mask[:] = 0
            mask[[1, length - 1]] = 1  # two runs from the second token on
        docs.append(mask)
    docs.append(np.r_[np.ones(3), np.zeros(12), np.ones(5)].astype(np.uint8))  # long: its middle piece has no target
    lengths = np.array([len(m) for m in docs], np.int64)
    prompts = np.array([int(np.argmax(m)) if m.any() else len(m) for m in docs], np.int64)
    masks = np.concatenate(docs)
    write_spill(tmp_path / "a", [(0, rng.integers(1, 9, len(masks)), masks, lengths, prompts, [False] * len(docs))])
    spill = SourceSpill(tmp_path / "a", "train", np.uint16)
    view = DocumentView([spill], [np.arange(len(docs))])
    read = []
    masks_of = shards.MaskView.__getitem__
    monkeypatch.setattr(shards.MaskView, "__getitem__", lambda self, doc: read.append(doc) or masks_of(self, doc))
    turns = view.irregular_masks(lengths, prompts)
    irregular = {doc: docs[doc] for doc in turns.docs.tolist()}
    assert read == [] and len(irregular) > 100 and sum(irregular[d].sum() == 1 == irregular[d][0] for d in irregular) > 10
    pieces, counts = plan_piece_array(lengths, prompts, 8, overlong, turns)
    want, dropped = plan_reading_every_turn(lengths, prompts, 8, overlong, irregular)
    assert pieces.tolist() == [list(p) for p in want] and counts.dropped_unsupervised == dropped > 0
    assert set(read) == {doc for doc in irregular if lengths[doc] > 8} if overlong != "drop" else read == []
    assert plan_piece_array(lengths, prompts, 8, overlong, irregular)[0].tolist() == pieces.tolist()


def test_assemble_pieces_and_cut_piece_list_take_blocks_as_flat_arrays(tmp_path):
    write_spill(tmp_path / "a", [(0, [7, 8, 9, 4, 5, 6, 3], [0, 1, 1, 1, 1, 1, 1], [3, 4], [1, 0], [False, False])])
    view = DocumentView([SourceSpill(tmp_path / "a", "train", np.uint16)], [np.array([1, 0])])  # docs: a1 a0
    blocks = [[(0, 0, 3), (1, 1, 3)], [], [(0, 3, 4)]]  # an empty block is padding only
    pieces, per_block = np.array([p for b in blocks for p in b]), np.array([2, 0, 1])
    ids, mask, lens = assemble_pieces(pieces, per_block, view, 6, 0, np.uint16)
    assert ids.tolist() == [[4, 5, 6, 8, 9, 0], [0] * 6, [3, 0, 0, 0, 0, 0]]
    assert mask.tolist() == [[0, 1, 1, 0, 1, 0], [0] * 6, [0] * 6]
    assert lens == [[3, 2], [], [1]]
    assert [a.tolist() for a in assemble_blocks(blocks, view, 6, 0, np.uint16)[:2]] == [ids.tolist(), mask.tolist()]
    assert cut_piece_list(pieces, per_block, np.array([4, 3])) == [[0, 0], [0, 1], [2, 0]] == cut_pieces(blocks, [4, 3])
