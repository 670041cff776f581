"""Near dedup's band keys made in the encode workers and spilled (pipeline/pack/near_bands.py, spill.py's
``<split>.bands``): the keys the build's process made from the spill's words before, whoever makes them."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from build_fixtures import seed_decision
from packtrain.core.contract import token_dtype
from packtrain.pipeline.orchestrate.build import build, plan_inputs
from packtrain.pipeline.pack import mix, near_bands, near_dup, near_words
from packtrain.pipeline.pack.spill import SOURCES, SPLITS, SourceSpill, SpillWriter, merge_spills, source_key
from test_near_dup import configured, quiet, spill_of, sql_project
from test_spill import STATS

PIECES = ["", " ", "  \n", "a", " b", "c ", " d e ", "x" * 70, " " + "y" * 63, "zz", "\u00c9t\u00e9", "q r s",
          "SELECT", "(*)", " 12", "w" * 40]


def random_docs(seed: int, n: int = 300) -> list[tuple[list[int], list[int]]]:
    rng = np.random.default_rng(seed)
    return [(rng.integers(0, len(PIECES), k).tolist(), rng.integers(0, 2, k).tolist()) for k in rng.integers(0, 40, n)]


def test_a_batch_has_the_band_keys_of_its_documents_in_the_spill_whatever_the_batch():
    """A worker's batch_bands of any cut of the documents into batches (and near_dup.BATCH's sub-batches)
    equals near_dup.bands_of over the spill's words, document by document, every other document too."""
    units = near_words.table_units(near_words.token_table(PIECES))
    docs = random_docs(49)
    spill = spill_of(docs)
    expected = near_dup.bands_of(near_words.SpillWords({"train": [spill]}, units))("train", 0, np.arange(len(docs)))
    for cut in ([0, 300], [0, 1, 7, 150, 300], [0, 299, 300]):
        got = [near_bands.batch_bands(units, *(lambda s: (s.tokens, s.masks, s.lengths))(spill_of(docs[a:b])))
               for a, b in zip(cut[:-1], cut[1:])]
        assert np.concatenate(got).tolist() == expected.tolist()
    every_other = near_dup.bands_of(near_words.SpillWords({"train": [spill]}, units))("train", 0, np.arange(1, 300, 2))
    assert every_other.tolist() == expected[1::2].tolist()
    assert len({tuple(row) for row in expected.tolist()}) > 250  # not one key for all


def test_the_pinned_literal_documents_have_their_pinned_band_keys_in_a_batch(monkeypatch):
    """The literal documents of test_near_dup's pinned measure, as a worker hashes them, sub-batches of 3
    documents (near_dup.BATCH patched): the same literal keys."""
    pieces = ["", "Select", " COUNT", "(*)", " FROM", "\n\n ", " \u00dcn\u00efcode", "x" * 40, "Y" * 50, "a b",
              " ", "_v2", "SQL\n", "\u00c9"]
    spill = spill_of([([1, 2, 3, 4, 11, 0, 13], [0, 0, 0, 1, 1, 1, 1]),
                      ([0, 7, 8, 7, 10, 9, 5, 12], [0, 0, 0, 0, 0, 1, 1, 1]),
                      ([6, 5, 1, 4, 2, 3], [0, 1, 0, 1, 0, 1]), ([0, 10], [0, 1])])
    monkeypatch.setattr(near_dup, "BATCH", 3)
    keys = near_bands.batch_bands(near_words.table_units(near_words.token_table(pieces)), spill.tokens, spill.masks,
                                  spill.lengths)
    assert keys.dtype == np.uint64 and keys.shape == (4, near_dup.BANDS)
    assert keys[:, :2].tolist() == [[7931602493018334901, 12857807918175617509],
                                    [762259472382194872, 4237534490372229423],
                                    [12004696769599897733, 940009669324409302],
                                    [5640439496769244039, 13778317778509204560]]


def write_bands_spill(directory, batches, bands: bool = True):
    """batches: (number, documents as (ids, mask), is_val); each document's band keys: its index repeated."""
    writer = SpillWriter(directory, np.uint16, bands=bands)
    at = 0
    try:
        for number, docs, is_val in batches:
            s = spill_of(docs)
            tokens = s.tokens.astype(np.uint16)
            keys = np.repeat(np.arange(at, at + len(docs), dtype=np.uint64)[:, None], near_dup.BANDS, 1)
            writer.add_batch(number, tokens, s.masks, s.lengths, np.zeros(len(docs), np.int64), np.array(is_val),
                             mix.document_keys(tokens, s.masks, s.lengths), keys if bands else None)
            at += len(docs)
        writer.close(dataclasses.replace(STATS, batches=len(batches)))
    finally:
        writer.abort()


def test_a_spill_keeps_each_documents_band_keys_with_its_split_and_a_merge_keeps_them(tmp_path):
    docs = random_docs(7, 5)
    write_bands_spill(tmp_path / "a", [(0, docs[:3], [False, True, False]), (2, docs[3:], [False, False])])
    write_bands_spill(tmp_path / "b", [(1, docs[:1], [True])])
    train, val = (SourceSpill(tmp_path / "a", split, np.uint16) for split in SPLITS)
    assert train.has_bands() and train.bands[:, 0].tolist() == [0, 2, 3, 4] and val.bands[:, 5].tolist() == [1]
    assert train.batch(1)[5].tolist() == [[3] * 12, [4] * 12]
    merge_spills([tmp_path / "a", tmp_path / "b"], tmp_path / "m", np.uint16, dataclasses.replace(STATS, batches=3))
    merged = {split: SourceSpill(tmp_path / "m", split, np.uint16) for split in SPLITS}
    assert merged["train"].bands[:, 0].tolist() == [0, 2, 3, 4] and merged["val"].bands[:, 0].tolist() == [1, 0]
    write_bands_spill(tmp_path / "none", [(0, docs, [False] * 5)], bands=False)
    assert not SourceSpill(tmp_path / "none", "train", np.uint16).has_bands()
    assert (tmp_path / "none" / "train.bands").stat().st_size == 0
    s = spill_of(docs)
    writer = SpillWriter(tmp_path / "missing", np.uint16, bands=True)
    with pytest.raises(ValueError, match="band keys None for 5 documents, a spill with them"):
        writer.add_batch(0, s.tokens, s.masks, s.lengths, np.zeros(5, np.int64), np.zeros(5, bool),
                         np.zeros((5, 16), np.uint8), None)
    writer.abort()


def test_a_near_build_spills_the_keys_its_process_would_make_and_an_exact_build_none(tmp_path):
    """Two worker processes make the band keys as they tokenize: the spill holds, for every document,
    the keys the build's process makes from its words; the source key says so (an exact build's source
    is another directory, without keys; a decontaminate-only build shares the near build's)."""
    project = sql_project(tmp_path)
    seed_decision(project["cache"], project["model"])
    for settings in ({"dedup": "near"}, {}):
        build(configured(project, num_proc=2, batch_rows=16, **settings), project["cache"], log=quiet, progress=False)
    inputs = {name: plan_inputs(configured(project, **settings))[2] for name, settings in
              {"near": {"dedup": "near"}, "exact": {}, "decontaminate": {"decontaminate": True}}.items()}
    keys = {name: source_key(i, 0) for name, i in inputs.items()}
    assert keys["near"] == keys["decontaminate"] != keys["exact"]
    sources = project["cache"] / "sql" / SOURCES
    tokenizer = plan_inputs(configured(project))[1]
    units = near_bands.units(str(tokenizer.directory / "tokenizer.json"),
                             tokenizer.fingerprint["files"]["tokenizer.json"], tokenizer.vocab_size)
    for split in SPLITS:
        spill = SourceSpill(sources / keys["near"], split, token_dtype(tokenizer.vocab_size))
        words = near_words.SpillWords({split: [spill]}, units)
        assert spill.has_bands() and len(spill.lengths) > 10
        assert spill.bands.tolist() == near_dup.bands_of(words)(split, 0, np.arange(len(spill.lengths))).tolist()
        assert not SourceSpill(sources / keys["exact"], split, token_dtype(tokenizer.vocab_size)).has_bands()
    near_bands.units.cache_clear()
