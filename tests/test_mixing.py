"""Mixing weights per source and exact dedup (pipeline/pack/mix.py), end to end through the build."""

from __future__ import annotations

import json

import numpy as np
import pytest
from build_fixtures import make_project, rows, seed_decision, write_jsonl

from packtrain.core.configfile import load_config
from packtrain.core.contract import Manifest
from packtrain.core.shardfile import open_shard
from packtrain.pipeline.orchestrate.build import build
from packtrain.pipeline.pack.mix import exact_overlap, key_rows, select, weighted


def quiet(*_):
    pass


@pytest.fixture
def project(tmp_path):
    return make_project(tmp_path, n_rows=40, val_fraction=0.0)


def run_build(project, sources=None, **overrides):
    if sources is not None:
        overrides["sources"] = sources
    return build(load_config("sql", project["configs"], overrides), project["cache"], log=quiet, progress=False)


def report_of(result) -> dict:
    return json.loads((result.path / "report.json").read_text())


def documents_in_shards(result, split: str = "train") -> list[tuple[int, ...]]:
    """Every packed document's tokens, sorted (the packing order does not matter here)."""
    block_size = Manifest.load(result.path).block_size
    docs = []
    for shard in sorted(result.path.glob(f"{split}-*.arrow")):
        ids, _, doc_lens = open_shard(shard, block_size).arrays()
        for row, lens in zip(ids, doc_lens):
            at = 0
            for n in lens:
                docs.append(tuple(row[at : at + n].tolist()))
                at += n
    return sorted(docs)


@pytest.mark.parametrize("weight, documents", [(0.25, 10), (1, 40), (3, 120), (2.5, 100), (0.1, 4)])
def test_a_weight_scales_the_training_documents_exactly(project, weight, documents):
    result = run_build(project, sources=[{"name": str(project["data"]), "weight": weight}])
    report = report_of(result)
    mixed = report["sources"][0]["mix"]["train"]
    assert (mixed["documents_before"], mixed["duplicates"], mixed["documents"]) == (40, 0, documents)
    assert report["train"]["documents"] == documents
    assert report["sources"][0]["weight"] == weight
    assert Manifest.load(result.path, full=True).inputs["sources"][0]["weight"] == weight


def test_a_fractional_weight_takes_the_same_documents_in_every_build(project, tmp_path):
    first = run_build(project, sources=[{"name": str(project["data"]), "weight": 2.5}])
    seed_decision(tmp_path / "other-cache", project["model"])
    again = build(load_config("sql", project["configs"], {"sources": [{"name": str(project["data"]), "weight": 2.5}]}),
                  tmp_path / "other-cache", log=quiet, progress=False)
    assert again.build_id == first.build_id
    assert [p.read_bytes() for p in sorted(first.path.glob("*.arrow"))] == \
           [p.read_bytes() for p in sorted(again.path.glob("*.arrow"))]
    docs = documents_in_shards(first)
    counts = {doc: docs.count(doc) for doc in set(docs)}
    assert sorted(counts.values()) == [2] * 20 + [3] * 20  # every document twice, exactly half a third time


def test_a_weight_changes_the_build_id_but_reuses_the_tokens(project):
    once = run_build(project)
    weighted_build = run_build(project, sources=[{"name": str(project["data"]), "weight": 0.5}])
    assert weighted_build.build_id != once.build_id
    assert report_of(weighted_build)["sources"][0]["reused"] is True


def test_exact_duplicates_are_packed_once_within_and_across_sources(project, tmp_path):
    data = rows(40)
    write_jsonl(project["data"], data + data[:5])  # 5 duplicates within the source
    other = write_jsonl(tmp_path / "data" / "more.jsonl", data[30:] + rows(6, start=100))  # 10 in the first
    sources = [{"name": str(project["data"])}, {"name": str(other)}]
    report = report_of(run_build(project, sources=sources))
    assert [s["mix"]["train"]["duplicates"] for s in report["sources"]] == [5, 10]
    assert [s["mix"]["train"]["documents"] for s in report["sources"]] == [40, 6]
    assert report["duplicates"] == 15 and report["dedup"] == "exact"
    assert report["train"]["documents"] == 46

    kept = report_of(run_build(project, sources=sources, **{"build.dedup": "none"}))
    assert kept["duplicates"] == 0 and kept["train"]["documents"] == 61


def test_no_document_is_in_both_train_and_val(tmp_path):
    project = make_project(tmp_path, n_rows=60, val_fraction=0.3)
    write_jsonl(project["data"], rows(60) + rows(60))
    result = run_build(project)
    report = report_of(result)
    assert report["duplicates"] == 60
    assert report["train"]["documents"] + report["val"]["documents"] == 60
    val_docs = set(documents_in_shards(result, "val"))
    assert val_docs and not val_docs & set(documents_in_shards(result))


def test_select_drops_a_training_document_equal_to_a_validation_one():
    keys = {"val": [key_rows(b"v1", b"v2")], "train": [key_rows(b"t1", b"v2", b"t2", b"t1")]}
    selection, duplicates = select(keys, [1.0], dedup=True)
    assert [s.tolist() for s in selection["train"]] == [[0, 2]]
    assert duplicates == {"val": [0], "train": [2]}
    selection, duplicates = select(keys, [1.0], dedup=False)
    assert [s.tolist() for s in selection["train"]] == [[0, 1, 2, 3]]


def test_weighted_rounds_the_fraction_and_keeps_index_order():
    keys = key_rows(*(bytes([k]) for k in (5, 1, 4, 2, 3)))
    # 0.5 x 5 = 2.5 documents, rounded half up: the 3 of smallest key (1, 2, 3)
    assert weighted(np.arange(5), keys, 1.5).tolist() == [0, 1, 2, 3, 4, 1, 3, 4]
    assert weighted(np.array([0, 2, 4]), keys, 0.5).tolist() == [2, 4]  # 1.5 -> 2: keys 3 and 4


def test_a_whole_weight_repeats_every_document_without_sorting_the_keys():
    class Unread(list):  # a build's 200k keys took 0.18 s to sort for a weight of 1.0 (docs/BENCHMARKS.md)
        def __getitem__(self, i):
            raise AssertionError("a whole weight chooses no fraction: no key needs reading")

    assert weighted(np.arange(3), Unread([b"c", b"a", b"b"]), 2.0).tolist() == [0, 1, 2, 0, 1, 2]
    assert weighted(np.arange(3), Unread([b"c", b"a", b"b"]), 1.0).tolist() == [0, 1, 2]


@pytest.mark.parametrize("dedup", [True, False])
@pytest.mark.parametrize("shared_first_half", [True, False])
def test_mixing_on_key_rows_chooses_what_sets_and_sorted_bytes_choose(dedup, shared_first_half):
    """The key rows are sorted as numbers (no Python object per document); what they choose is what a
    set of bytes and ``sorted(key=bytes)`` choose: copies (ties), and keys that differ only in their last
    bytes (``shared_first_half``: the sort by both halves) or in their first (the sort by the first alone)."""
    rng = np.random.default_rng(5)
    distinct = rng.integers(0, 256, size=(6, 16)).astype(np.uint8)  # distinct first halves
    def keys(n):  # few distinct keys: many copies, within and across sources and splits
        if not shared_first_half:
            return distinct[rng.integers(0, len(distinct), size=n)]
        rows = rng.integers(0, 3, size=(n, 16)).astype(np.uint8)
        rows[:, :14] = 7
        return rows
    keys_of = {"val": [keys(9), keys(0)], "train": [keys(40), keys(25)]}
    weights = [1.7, 0.3]
    as_bytes = {split: [[bytes(k) for k in source] for source in sources] for split, sources in keys_of.items()}
    seen, want, want_duplicates = set(), {}, {}
    for split in ("val", "train"):
        want[split], want_duplicates[split] = [], []
        for source, weight in zip(as_bytes[split], weights):
            kept = [i for i, key in enumerate(source) if not dedup or (key not in seen and not seen.add(key))]
            want_duplicates[split].append(len(source) - len(kept))
            if split == "train":
                extra = int(weight % 1 * len(kept) + 0.5)
                kept = kept * int(weight) + sorted(sorted(kept, key=lambda i: source[i])[:extra])
            want[split].append(kept)
    got, duplicates = select(keys_of, weights, dedup)
    assert {split: [s.tolist() for s in sources] for split, sources in got.items()} == want
    assert duplicates == want_duplicates
    train = {key for source in as_bytes["train"] for key in source}
    assert exact_overlap(keys_of) == [sum(key in train for key in source) for source in as_bytes["val"]]
