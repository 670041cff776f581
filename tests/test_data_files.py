"""Which files of a dataset directory form a split: the ones ``datasets.load_dataset(directory, split=...)``
reads, in its order (pipeline/read/data_files.py). Before, a split was any file with the split's name as a
word of its path, case-insensitive: push_to_hub's ``data/train_sft-00000-of-00001.parquet`` was not
``train_sft`` but part of ``train`` (with ``train_gen``), ``train1.jsonl`` and ``test1.jsonl`` were
both ``train``, and ``eval.jsonl`` (datasets' test split) and ``training_data.jsonl`` were no split."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
from collections import Counter
from pathlib import Path

import pytest

from conftest import parquet_bytes, write_hub_repo
from packtrain.core.config_sources import SourceConfig
from packtrain.core.resolve import SourceNotFound
from packtrain.pipeline.read.discover import SourceError, resolve_source
from packtrain.pipeline.read.sources import iter_batches


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
    "__ directories are in no split": {"data.jsonl": jsonl("d"), "__pycache__/more.jsonl": jsonl("p"),
                                       "__x/train.jsonl": jsonl("x"), ".hidden/y.jsonl": jsonl("h")},
    "config.json is not data": {"data.jsonl": jsonl("d"), "config.json": b'{"q": "not a row"}'},
    # compressed files: split by the whole name, counted as the format they hold (datasets counts every suffix)
    "compressed split names": {"train.jsonl.gz": gzip.compress(jsonl("gz")), "train_b.jsonl": jsonl("pl"),
                               "test.jsonl.bz2": bz2.compress(jsonl("bz")), "dev-1.jsonl.xz": lzma.compress(jsonl("xz"))},
    "compressed counted as what they hold": {"train.jsonl.gz": gzip.compress(jsonl("g")),
                                             "train_a.json.xz": lzma.compress(jsonl("x")), "train.csv": b"q\nc0\n"},
    "compressed in split directories": {"train/a.csv.gz": gzip.compress(b"q\na0\na1\n"), "train/b.csv": b"q\nb0\n",
                                        "test/c.csv.bz2": bz2.compress(b"q\nt0\n"), "test/d.csv.xz": lzma.compress(b"q\nt1\n"),
                                        "test/notes.jsonl": jsonl("n", 1)},  # 2 CSV files to 1 JSON
    "tsv, plain and compressed": {"train.tsv": b"q\tx\nt0\t1\n", "train_z.tsv.xz": lzma.compress(b"q\nz0\nz1\n"),
                                  "validation.tsv.gz": gzip.compress(b"x\tq\n1\tv0\n")},
}


def write_tree(directory: Path, files: dict[str, bytes]) -> Path:
    """``files`` (relative path -> bytes) written under ``directory``."""
    for rel, data in files.items():
        (directory / rel).parent.mkdir(parents=True, exist_ok=True)
        (directory / rel).write_bytes(data)
    return directory


def rows(name: str, split: str) -> list:
    source = resolve_source(SourceConfig(name=name, split=split))
    return [q for batch in iter_batches(source, ["q"], 2) for q in batch.columns["q"]]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_split_holds_the_rows_load_dataset_gives_it_in_its_order(tmp_path, hf_home, layout):
    import datasets

    directory = tmp_path / "ds"
    write_tree(directory, LAYOUTS[layout])
    reference = datasets.load_dataset(str(directory), cache_dir=str(tmp_path / "datasets-cache"))
    for split in reference:
        assert rows(str(directory), split) == reference[split]["q"], split
    for split in {"train", "validation", "test"} - set(reference):
        with pytest.raises(SourceNotFound, match=f"no data file for split '{split}'.*its splits: {', '.join(reference)}"):
            rows(str(directory), split)


def test_a_directory_of_20000_files_plans_in_one_pass(monkeypatch):
    """Before, each of the 48 keyword patterns parsed every path (PurePosixPath) and the format pick was
    quadratic: 10,000 files took 3 s to plan, 100,000 never finished. The work is counted, not timed:
    one match per split, file and layout (2 layouts x 3 splits), and two format looks per file."""
    from packtrain.pipeline.read import data_files

    work = Counter()

    def counted(name, function):
        def call(*args):
            work[name] += 1
            return function(*args)
        monkeypatch.setattr(data_files, name, call)

    counted("_first_pattern", data_files._first_pattern)
    counted("file_format", data_files.file_format)
    for rels in ([f"part-{i:05d}.jsonl" for i in range(20000)],
                 [f"d{i % 100}/train-{i:05d}.jsonl" for i in range(19000)] + [f"test-{i}.csv" for i in range(1000)]):
        work.clear()
        found = data_files.splits(rels)
        read, other = data_files.read_format(found["train"] + found.get("test", []))
        assert (len(read), len(other), len(found["train"])) == ((20000, 0, 20000) if len(found) == 1 else (19000, 1000, 19000))
        assert work == {"_first_pattern": 2 * 3 * 20000, "file_format": 2 * 20000}


def test_a_hub_snapshot_pushed_with_its_own_split_names(hub_cache):
    write_hub_repo(hub_cache.hub, "dataset", "org/ultra", "c" * 40, LAYOUTS["push_to_hub split names"])
    assert rows("org/ultra", "train_sft") == ["sft0", "sft1"]
    assert rows("org/ultra", "train_gen") == ["gen0"]
    with pytest.raises(SourceNotFound, match=r"no data file for split 'train' .*\(its splits: test_sft, train_gen, "
                                             r"train_sft\); set split: under the source in configs/<expert>.yaml to one of them"):
        rows("org/ultra", "train")


def test_a_hub_snapshot_of_compressed_json_lines(hub_cache):
    """The snapshot's files are links to blobs without a suffix: the link's name says the compression."""
    write_hub_repo(hub_cache.hub, "dataset", "org/dumps", "e" * 40,
                   {"data/train-00000-of-00002.jsonl.gz": gzip.compress(jsonl("a")),
                    "data/train-00001-of-00002.jsonl.gz": gzip.compress(jsonl("b")),
                    "data/test-00000-of-00001.jsonl.xz": lzma.compress(jsonl("t", 1))})
    assert rows("org/dumps", "train") == ["a0", "a1", "b0", "b1"]
    assert rows("org/dumps", "test") == ["t0"]


GSM8K_README = """---
configs:
- config_name: main
  data_files:
  - split: train
    path: main/train-*
  - split: test
    path: main/test-*
- config_name: socratic
  data_files:
  - split: train
    path: socratic/train-*
  - split: test
    path: socratic/test-*
---
# gsm8k
"""
GSM8K = {"README.md": GSM8K_README.encode(),
         "main/train-00000-of-00001.parquet": parquet_bytes({"q": ["m0", "m1", "m2"]}),
         "main/test-00000-of-00001.parquet": parquet_bytes({"q": ["mt0"]}),
         "socratic/train-00000-of-00001.parquet": parquet_bytes({"q": ["s0", "s1"]}),
         "socratic/test-00000-of-00001.parquet": parquet_bytes({"q": ["st0"]})}
SUBSETS = {"README.md": b"---\nconfigs:\n- config_name: en\n  data_dir: en\n  default: true\n- config_name: fr\n"
                        b"  data_files: \"fr/*.jsonl\"\n- config_name: all\n  data_files:\n  - split: train\n"
                        b"    path: [\"fr/**\", \"en/tr*.jsonl\"]\n---\n",
           "en/train.jsonl": jsonl("en"), "en/test.jsonl": jsonl("ent"), "fr/a.jsonl": jsonl("fr")}


@pytest.mark.parametrize("layout", ["gsm8k", "subsets"])
def test_each_readme_config_reads_what_load_dataset_reads_for_it(tmp_path, hf_home, layout):
    """The README's configs: (subsets) name the data files; before, every config's train files were
    read together as one train split (gsm8k's main and socratic answers mixed)."""
    import datasets

    directory = tmp_path / layout
    write_tree(directory, GSM8K if layout == "gsm8k" else SUBSETS)
    configs = ["main", "socratic"] if layout == "gsm8k" else [None, "en", "fr", "all"]
    for config in configs:
        reference = datasets.load_dataset(str(directory), config, cache_dir=str(tmp_path / "datasets-cache"))
        for split in reference:
            source = resolve_source(SourceConfig(name=str(directory), split=split, config=config))
            got = [q for batch in iter_batches(source, ["q"], 2) for q in batch.columns["q"]]
            assert got == reference[split]["q"], (config, split)


def test_several_readme_configs_and_none_chosen_is_an_error_naming_them(hub_cache):
    write_hub_repo(hub_cache.hub, "dataset", "openai/gsm8k", "d" * 40, GSM8K)
    with pytest.raises(SourceError, match=r"README.md: it has 2 configs and none is the default \(main, socratic\); "
                                          r"set config: under the source"):
        rows("openai/gsm8k", "train")
    with pytest.raises(SourceError, match=r"it has no config 'mian' \(its configs: main, socratic\)"):
        resolve_source(SourceConfig(name="openai/gsm8k", config="mian"))
    source = resolve_source(SourceConfig(name="openai/gsm8k", config="socratic"))
    assert [p.relative_to(source.root).as_posix() for p in source.files] == ["socratic/train-00000-of-00001.parquet"]
    assert source.fingerprint()["config"] == "socratic"
    assert "config" not in resolve_source(SourceConfig(name="b-mc2/sql-create-context")).fingerprint()
    with pytest.raises(SourceError, match=r"config 'main' is set, but the dataset's README.md lists no configs"):
        resolve_source(SourceConfig(name="b-mc2/sql-create-context", config="main"))


GLOBS = {"a.jsonl": jsonl("a"), "x1.jsonl": jsonl("x1"), "xa.jsonl": jsonl("xa"), "d/c.jsonl": jsonl("c"),
         ".hd/g.jsonl": jsonl("g"), "d/.h.jsonl": jsonl("h"), "__s/i.jsonl": jsonl("i"), "d/__s/j.jsonl": jsonl("j")}


@pytest.mark.parametrize("pattern", ["x[^0-9].jsonl", "x[!0-9].jsonl", ".*/*.jsonl", "d/.*", "**/*.jsonl", "d/**",
                                     "__s/*", "**/__s/*", "./a.jsonl"])
def test_a_data_files_glob_matches_what_load_dataset_reads(tmp_path, hf_home, pattern):
    """fsspec's glob, as datasets resolves it: before, ``[^0-9]`` negated (fsspec reads a ``^`` or a digit),
    a hidden file a pattern names was never read, and ``__`` directories were read by ``**``."""
    import datasets

    directory = tmp_path / "ds"
    readme = f"---\nconfigs:\n- config_name: c\n  data_files:\n  - split: train\n    path: {json.dumps(pattern)}\n---\n"
    write_tree(directory, {**GLOBS, "README.md": readme.encode()})
    reference = datasets.load_dataset(str(directory), split="train", cache_dir=str(tmp_path / "datasets-cache"))
    assert rows(str(directory), "train") == reference["q"]


def test_a_double_star_inside_a_name_is_refused_as_datasets_refuses_it(tmp_path):
    directory = tmp_path / "ds"
    (directory / "d").mkdir(parents=True)
    (directory / "d" / "c.jsonl").write_bytes(jsonl("c"))
    (directory / "README.md").write_text("---\nconfigs:\n- config_name: c\n  data_files: d/**.jsonl\n---\n")
    with pytest.raises(SourceError, match=r"README.md: config 'c': data_files pattern 'd/\*\*.jsonl' is not a glob "
                                          r"datasets reads \(Invalid pattern: '\*\*' can only be an entire path "
                                          r"component\); write '\*\*' as a whole path component"):
        rows(str(directory), "train")


CARD = "configs:\n- config_name: a\n  data_files: a.jsonl\n- config_name: b\n  data_files: b.jsonl\n"
CARDS = {"a BOM before the header": "\ufeff---\n" + CARD + "  default: true\n---\n",
         "a blank line before the header": "\n---\n" + CARD + "  default: true\n---\n",
         "---- is not a header": "----\nconfigs: [\n----\n",
         "default: 1 is the default": "---\n" + CARD + "  default: 1\n---\n",
         "data_dir ./sub/": "---\nconfigs:\n- config_name: s\n  data_dir: ./sub/\n---\n"}


@pytest.mark.parametrize("card", CARDS)
def test_a_readme_header_is_read_as_load_dataset_reads_it(tmp_path, hf_home, card):
    """huggingface_hub's header (REGEX_YAML_BLOCK, utf-8-sig) and datasets' default config: before, a BOM
    or a blank line before ``---`` hid the configs (both files read as train), ``----`` was a header that
    did not parse, ``default: 1`` was no default, and ``data_dir: ./sub/`` named no file."""
    import datasets

    directory = tmp_path / "ds"
    files = {"a.jsonl": jsonl("a"), "b.jsonl": jsonl("b"), "sub/train.jsonl": jsonl("s"),
             "README.md": CARDS[card].encode()}
    write_tree(directory, files)
    reference = datasets.load_dataset(str(directory), split="train", cache_dir=str(tmp_path / "datasets-cache"))
    assert rows(str(directory), "train") == reference["q"]


def test_several_default_configs_are_refused_as_load_dataset_refuses_them(tmp_path):
    directory = tmp_path / "ds"
    directory.mkdir()
    (directory / "a.jsonl").write_bytes(jsonl("a"))
    (directory / "README.md").write_text("---\n" + CARD.replace("config_name: a", "config_name: default")
                                         + "  default: true\n---\n")
    with pytest.raises(SourceError, match=r"it marks several configs as the default \(default, b: named default or "
                                          r"default: true\), which load_dataset refuses; set config: under the source"):
        rows(str(directory), "train")


@pytest.mark.parametrize("data_files, message", [
    ('"nothing/*.jsonl"', r"the data_files of split 'train' \(nothing/\*.jsonl\) match no data file \(its data files: "
                          r"a.jsonl, b.jsonl\); correct the patterns"),
    ('["a.jsonl", "c.jsonl"]', r"split 'train' names the file 'c.jsonl', which is not there \(its data files: a.jsonl, "
                               r"b.jsonl\); correct the path")])
def test_readme_data_files_that_name_no_file_are_an_error_naming_them(tmp_path, hf_home, data_files, message):
    """As load_dataset refuses them (no data files found; a file path it cannot find). Before, the split was
    'not on this machine', with 'its splits: train' beside it (a pattern matching nothing), or the files that
    were there were read without the missing one."""
    import datasets

    directory = write_tree(tmp_path / "ds", {"a.jsonl": jsonl("a"), "b.jsonl": jsonl("b"),
                                              "README.md": f"---\nconfigs:\n- config_name: c\n  data_files: {data_files}\n"
                                                           "---\n".encode()})
    with pytest.raises(Exception):
        datasets.load_dataset(str(directory), split="train", cache_dir=str(tmp_path / "datasets-cache"))
    with pytest.raises(SourceError, match=r"ds/README.md: config 'c': " + message):
        rows(str(directory), "train")


def test_a_missing_split_is_named_whatever_the_other_splits_patterns_match(tmp_path, hf_home):
    """split: validation of a README with train and test, whose test pattern matches nothing: the error said
    test's patterns match nothing, not that there is no split 'validation'."""
    directory = write_tree(tmp_path / "ds", {"train.jsonl": jsonl("t"), "README.md": (
        '---\nconfigs:\n- config_name: c\n  data_files:\n  - {split: train, path: train.jsonl}\n'
        '  - {split: test, path: "missing/*.jsonl"}\n---\n').encode()})
    with pytest.raises(SourceNotFound, match=r"no data file for split 'validation' .*\(its splits: train, test\)"):
        rows(str(directory), "validation")


def test_a_config_on_a_source_without_configs_is_refused_not_ignored(tmp_path, hf_home):
    """A single file, the bundled sample or a save_to_disk directory has no README configs: config: was
    ignored there (the build read the file as if it were not set), while a dataset directory refused it."""
    write_tree(tmp_path, {"rows.jsonl": jsonl("r"), "saved/state.json": b"{}"})
    for name, what in [(str(tmp_path / "rows.jsonl"), "a single data file"), ("bundled", "the bundled sample"),
                       (str(tmp_path / "saved"), "a save_to_disk directory")]:
        with pytest.raises(SourceError, match=f"config 'main' is set, but {what} has no configs .*; remove config:"):
            resolve_source(SourceConfig(name=name, config="main"), expert="sql")
    assert rows(str(tmp_path / "rows.jsonl"), "train") == ["r0", "r1"]
