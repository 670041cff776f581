"""Which files of a dataset directory form a split: the ones ``datasets.load_dataset(directory, split=...)``
reads, in its order (pipeline/data_files.py). Before, a split was any file with the split's name as a
word of its path, case-insensitive: push_to_hub's ``data/train_sft-00000-of-00001.parquet`` was not
``train_sft`` but part of ``train`` (with ``train_gen``), ``train1.jsonl`` and ``test1.jsonl`` were
both ``train``, and ``eval.jsonl`` (datasets' test split) and ``training_data.jsonl`` were no split."""

from __future__ import annotations

import json

import pytest

from conftest import parquet_bytes, write_hub_repo
from packtrain.core.config_build import SourceConfig
from packtrain.core.resolve import SourceNotFound
from packtrain.pipeline.discover import resolve_source
from packtrain.pipeline.sources import iter_batches


def jsonl(tag: str, n: int = 2) -> bytes:
    return "".join(json.dumps({"q": f"{tag}{i}"}) + "\n" for i in range(n)).encode()


LAYOUTS = {
    "push_to_hub split names": {"data/train_sft-00000-of-00001.parquet": parquet_bytes({"q": ["sft0", "sft1"]}),
                                "data/train_gen-00000-of-00001.parquet": parquet_bytes({"q": ["gen0"]}),
                                "data/test_sft-00000-of-00001.parquet": parquet_bytes({"q": ["tsft0"]})},
    "a digit ends the keyword": {"train1.jsonl": jsonl("tr"), "test1.jsonl": jsonl("te")},
    "eval and training": {"training_data.jsonl": jsonl("tr"), "eval.jsonl": jsonl("ev")},
    "a split directory wins over file names": {"train/a.jsonl": jsonl("tr"), "test/b.jsonl": jsonl("tb"),
                                               "other/test_x.jsonl": jsonl("tx")},
    "files in pattern order": {"data/train.jsonl": jsonl("B"), "data/a_train.jsonl": jsonl("A"), "data/test.jsonl": jsonl("T")},
    "the most common format": {"train.jsonl": jsonl("j"), "train_a.json": jsonl("a"), "train.parquet": parquet_bytes({"q": ["p"]})},
    "no split named": {"TRAIN.jsonl": jsonl("u"), "Test.jsonl": jsonl("l")},
}


def rows(name: str, split: str) -> list:
    source = resolve_source(SourceConfig(name=name, split=split))
    return [q for batch in iter_batches(source, ["q"], 2) for q in batch.columns["q"]]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_split_holds_the_rows_load_dataset_gives_it_in_its_order(tmp_path, hf_home, layout):
    import datasets

    directory = tmp_path / "ds"
    for rel, data in LAYOUTS[layout].items():
        (directory / rel).parent.mkdir(parents=True, exist_ok=True)
        (directory / rel).write_bytes(data)
    reference = datasets.load_dataset(str(directory), cache_dir=str(tmp_path / "datasets-cache"))
    for split in reference:
        assert rows(str(directory), split) == reference[split]["q"], split
    for split in {"train", "validation", "test"} - set(reference):
        with pytest.raises(SourceNotFound, match=f"no data file for split '{split}'.*its splits: {', '.join(reference)}"):
            rows(str(directory), split)


def test_a_hub_snapshot_pushed_with_its_own_split_names(hub_cache):
    write_hub_repo(hub_cache.hub, "dataset", "org/ultra", "c" * 40, LAYOUTS["push_to_hub split names"])
    assert rows("org/ultra", "train_sft") == ["sft0", "sft1"]
    assert rows("org/ultra", "train_gen") == ["gen0"]
    with pytest.raises(SourceNotFound, match=r"no data file for split 'train' .*\(its splits: test_sft, train_gen, "
                                             r"train_sft\) \(set split: under the source to one of them\)"):
        rows("org/ultra", "train")
