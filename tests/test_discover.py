"""Discovery, offline: hub cache, datasets cache, save_to_disk, local files, models and tokenizers."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil

import pytest
from conftest import MODEL_COMMIT, PARQUET_COMMIT, SQL_COMMIT, write_hub_repo
from huggingface_hub import scan_cache_dir

from packtrain.pipeline.read import discover
from packtrain.core.config_sources import SourceConfig
from packtrain.core.config_train import ModelConfig
from packtrain.core.resolve import SourceNotFound, resolve_model_dir, resolve_tokenizer_dir
from packtrain.pipeline.read.discover import SourceError, discover_all, format_discovery, resolve_source
from packtrain.pipeline.read.sources import iter_batches


def rel_files(source):
    return [p.relative_to(source.root).as_posix() for p in source.files]


def test_import_forces_offline_mode():
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    assert os.environ["HF_DATASETS_OFFLINE"] == "1"


def test_fixture_hub_cache_is_what_huggingface_hub_sees(hub_cache):
    info = scan_cache_dir(hub_cache.hub)
    assert info.warnings == []
    assert sorted((r.repo_type, r.repo_id, [rev.commit_hash for rev in r.revisions]) for r in info.repos) == [
        ("dataset", "b-mc2/sql-create-context", [SQL_COMMIT]),
        ("dataset", "org/parquet-ds", [PARQUET_COMMIT]),
        ("model", "org/tiny-model", [MODEL_COMMIT]),
    ]


def test_hub_single_json_file_is_the_train_split(hub_cache):
    source = resolve_source(SourceConfig(name="b-mc2/sql-create-context"))
    assert (source.kind, source.revision, source.split) == ("hub", SQL_COMMIT, "train")
    assert source.root == hub_cache.sql.resolve()
    assert rel_files(source) == ["sql_create_context_v4.json"]
    assert all(p.is_absolute() for p in source.files)
    assert source.describe() == "hub dataset b-mc2/sql-create-context@aaaaaaaa [train] (1 file, 492 B)"
    with pytest.raises(SourceNotFound, match=r"no data file for split 'test' among \['sql_create_context_v4.json'\]"):
        resolve_source(SourceConfig(name="b-mc2/sql-create-context", split="test"))


def test_hub_parquet_split_files(hub_cache):
    train = resolve_source(SourceConfig(name="org/parquet-ds"))
    test = resolve_source(SourceConfig(name="org/parquet-ds", split="test"))
    assert (train.kind, train.revision) == ("hub", PARQUET_COMMIT)
    assert rel_files(train) == ["data/train-00000-of-00001.parquet"]
    assert rel_files(test) == ["data/test-00000-of-00001.parquet"]
    with pytest.raises(SourceNotFound) as e:
        resolve_source(SourceConfig(name="org/parquet-ds", split="validation"))
    assert "'data/test-00000-of-00001.parquet', 'data/train-00000-of-00001.parquet'" in str(e.value)


def test_hub_revisions(hub_cache):
    assert resolve_source(SourceConfig(name="org/parquet-ds", revision="main")).revision == PARQUET_COMMIT
    assert resolve_source(SourceConfig(name="org/parquet-ds", revision="bbbbbbb")).revision == PARQUET_COMMIT
    with pytest.raises(SourceNotFound, match=r"revision 'v2' is not in the hub cache .* bbbbbbbb \(main\)"):
        resolve_source(SourceConfig(name="org/parquet-ds", revision="v2"))
    # two snapshots and no main ref: ambiguous, both listed
    for commit in ("1" * 40, "2" * 40):
        write_hub_repo(hub_cache.hub, "dataset", "org/two", commit, {"train.jsonl": b'{"a": 1}\n'}, refs=())
    with pytest.raises(SourceNotFound, match=r"2 snapshots .* 11111111 \(no ref\), 22222222 \(no ref\); set revision"):
        resolve_source(SourceConfig(name="org/two"))
    assert resolve_source(SourceConfig(name="org/two", revision="2" * 40)).revision == "2" * 40


def test_datasets_cache_prepared_by_datasets(prepared_dataset):
    train = resolve_source(SourceConfig(name="org/prepared-ds"))
    test = resolve_source(SourceConfig(name="org/prepared-ds", split="test"))
    assert (train.kind, train.revision, train.root) == ("datasets_cache", None, prepared_dataset)
    assert rel_files(train) == ["prepared-ds-train-00000-of-00002.arrow", "prepared-ds-train-00001-of-00002.arrow"]
    assert rel_files(test) == ["prepared-ds-test.arrow"]
    assert train.note == ""


def test_datasets_cache_newest_of_several_versions_is_said(prepared_dataset):
    newer = prepared_dataset.parent / ("f" * 64)
    shutil.copytree(prepared_dataset, newer)
    for p in newer.glob("*.arrow"):
        os.utime(p, (p.stat().st_mtime + 100, p.stat().st_mtime + 100))
    source = resolve_source(SourceConfig(name="org/prepared-ds"))
    assert source.root == newer
    assert "newest of 2 prepared versions" in source.describe()
    assert f"/0.0.0/{'f' * 64}" in source.note


def test_datasets_cache_with_several_configs_and_none_chosen_is_an_error_naming_them(prepared_dataset):
    """Before, the config prepared last was read (gsm8k's socratic for main, by mtime), with a note."""
    config = prepared_dataset.parent.parent.name
    shutil.copytree(prepared_dataset.parent.parent, prepared_dataset.parent.parent.with_name("socratic"))
    with pytest.raises(SourceError, match=rf"dataset 'org/prepared-ds': the datasets cache .* holds split 'train' of 2 "
                                          rf"configs \({config}, socratic\); set config: under the source"):
        resolve_source(SourceConfig(name="org/prepared-ds"))
    chosen = resolve_source(SourceConfig(name="org/prepared-ds", config="socratic"))
    assert chosen.root.parent.parent.name == "socratic" and chosen.note == ""
    assert resolve_source(SourceConfig(name="org/prepared-ds", config=config)).root == prepared_dataset


def test_hub_snapshot_without_the_split_falls_back_to_a_prepared_one(hub_cache, prepared_dataset):
    write_hub_repo(hub_cache.hub, "dataset", "org/prepared-ds", "d" * 40, {"prepared-ds.py": b"# loading script\n"})
    source = resolve_source(SourceConfig(name="org/prepared-ds", split="test"))
    assert source.kind == "datasets_cache"


def test_save_to_disk_dataset_and_dataset_dict(saved_datasets):
    ds = resolve_source(SourceConfig(name=str(saved_datasets.dataset)))
    assert (ds.kind, ds.root, rel_files(ds)) == ("save_to_disk", saved_datasets.dataset, ["data-00000-of-00001.arrow"])
    dd = resolve_source(SourceConfig(name=str(saved_datasets.dataset_dict), split="test"))
    assert (dd.kind, dd.root, rel_files(dd)) == ("save_to_disk", saved_datasets.dataset_dict, ["test/data-00000-of-00001.arrow"])
    with pytest.raises(SourceNotFound, match=r"saved DatasetDict with splits \['train', 'test'\], not 'validation'"):
        resolve_source(SourceConfig(name=str(saved_datasets.dataset_dict), split="validation"))


def test_local_file_and_directory(tmp_path, monkeypatch, hf_home):
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text('{"a": 1}\n')
    (data / "test.jsonl").write_text('{"a": 2}\n')
    (data / ".hidden").mkdir()
    (data / ".hidden" / "train.jsonl").write_text('{"a": 3}\n')
    monkeypatch.chdir(tmp_path)
    one = resolve_source(SourceConfig(name="./data/test.jsonl"))
    assert (one.kind, one.root, rel_files(one)) == ("local", data, ["test.jsonl"])
    both = resolve_source(SourceConfig(name="data"))
    assert (both.kind, rel_files(both)) == ("local", ["train.jsonl"])
    assert rel_files(resolve_source(SourceConfig(name=str(data), split="test"))) == ["test.jsonl"]
    (data / "notes.txt").write_text("x")
    with pytest.raises(SourceError, match=r"unsupported file type '.txt'"):
        resolve_source(SourceConfig(name="data/notes.txt"))


def test_compressed_and_tsv_files_are_data_files(tmp_path, hf_home):
    """Before, each of them was 'unsupported file type' (a file) or ignored as not a data file (in a
    directory); only the text formats are read compressed, and a compressed file's fingerprint is its
    stored bytes."""
    import gzip

    data = tmp_path / "data"
    data.mkdir()
    for name in ("train.jsonl.gz", "more_train.json.bz2", "train.csv.xz", "rows.TSV", "x.tsv.gz"):
        (data / name).write_bytes(b"")
        one = resolve_source(SourceConfig(name=str(data / name)))
        assert (one.kind, rel_files(one)) == ("local", [name])
    (data / "train.jsonl.gz").write_bytes(gzip.compress(b'{"a": 1}\n'))
    assert resolve_source(SourceConfig(name=str(data / "train.jsonl.gz"))).fingerprint()["files"] == [
        {"path": "train.jsonl.gz", "size": (data / "train.jsonl.gz").stat().st_size,
         "sha256": hashlib.sha256((data / "train.jsonl.gz").read_bytes()).hexdigest()}]
    for name, shown in (("t.parquet.gz", "'.parquet.gz'"), ("t.gz", "'.gz'"), ("t.jsonl.zst", "'.zst'")):
        (data / name).write_bytes(b"")
        with pytest.raises(SourceError, match=rf"unsupported file type {shown}; use one of .parquet, .arrow, .jsonl, "
                                              r"\.json, \.csv, \.tsv \(the text ones also compressed: \.gz, \.bz2, \.xz, "
                                              r"as train\.jsonl\.gz\)"):
            resolve_source(SourceConfig(name=str(data / name)))
    directory = resolve_source(SourceConfig(name=str(data)))
    assert rel_files(directory) == ["train.jsonl.gz", "more_train.json.bz2"]  # 2 JSON files to 1 CSV
    assert directory.note == ("ignored 6 files: rows.TSV (another split), t.gz (not a .parquet/.arrow/.jsonl/.json/"
                              ".csv/.tsv file), t.jsonl.zst (not a .parquet/.arrow/.jsonl/.json/.csv/.tsv file), "
                              "t.parquet.gz (not a .parquet/.arrow/.jsonl/.json/.csv/.tsv file), train.csv.xz (the "
                              ".jsonl.gz files are read), x.tsv.gz (another split)")


def test_bundled_sample(tmp_path, monkeypatch):
    monkeypatch.setattr(discover, "SAMPLES_DIR", tmp_path)
    (tmp_path / "sql.jsonl.gz").write_bytes(gzip.compress(b'{"question": "q", "context": "c", "answer": "a"}\n'))
    (tmp_path / "neo4j.jsonl").write_text("{}\n")  # not a bundled sample: those are <expert>.jsonl.gz
    source = resolve_source(SourceConfig(name="bundled"), expert="sql")
    assert (source.kind, source.name, source.root, rel_files(source)) == ("bundled", "bundled", tmp_path, ["sql.jsonl.gz"])
    assert [q for batch in iter_batches(source, ["question"], 8) for q in batch.columns["question"]] == ["q"]
    with pytest.raises(SourceNotFound, match=r"no bundled sample for expert 'neo4j'.*\(bundled: sql\)"):
        resolve_source(SourceConfig(name="bundled"), expert="neo4j")


def test_missing_dataset_says_where_it_looked_and_how_to_fix(hub_cache, prepared_dataset):
    with pytest.raises(SourceNotFound) as e:
        resolve_source(SourceConfig(name="org/nope"))
    message = str(e.value)
    assert f"hub cache {hub_cache.hub} (no datasets--org--nope)" in message
    assert f"datasets cache {hub_cache.home / 'datasets'} (no org___nope)" in message
    assert f"local path {os.path.abspath('org/nope')} (does not exist)" in message
    assert "huggingface-cli download --repo-type dataset org/nope" in message
    assert "configs/<expert>.yaml / --dataset at a local file" in message  # the CLI's option, not make's DATASET=
    from packtrain.core import hints

    with hints.given(configs_dir="/data/configs", via_make=True), pytest.raises(SourceNotFound) as e:
        resolve_source(SourceConfig(name="org/nope"))
    assert "point sources: in /data/configs/<expert>.yaml / DATASET= at a local file" in str(e.value)


def test_a_misspelt_dataset_or_model_id_names_the_close_one_in_the_caches(hub_cache, prepared_dataset):
    """Issue 47: ``acme/text2cypher-mni`` when the cache just scanned holds ``acme/text2cypher-mini``."""
    write_hub_repo(hub_cache.hub, "dataset", "acme/text2cypher-mini", "e" * 40, {"train.jsonl": b'{"a": 1}\n'})
    with pytest.raises(SourceNotFound) as e:
        resolve_source(SourceConfig(name="acme/text2cypher-mni"))
    assert str(e.value).splitlines()[0] == ("dataset 'acme/text2cypher-mni' (split 'train') is not on this machine "
                                            "(did you mean 'acme/text2cypher-mini'?); looked in:")
    with pytest.raises(SourceNotFound) as e:  # a prepared dataset of the datasets cache is one too
        resolve_source(SourceConfig(name="org/prepard-ds"))
    assert "is not on this machine (did you mean 'org/prepared-ds'?); looked in:" in str(e.value)
    with pytest.raises(SourceNotFound) as e:  # nothing close: nothing said
        resolve_source(SourceConfig(name="zzz/unrelated"))
    assert str(e.value).splitlines()[0] == "dataset 'zzz/unrelated' (split 'train') is not on this machine; looked in:"
    with pytest.raises(SourceNotFound) as e:  # models: among the cached models only, not the datasets
        resolve_model_dir("org/tiny-modle")
    assert str(e.value).splitlines()[0] == ("model 'org/tiny-modle' is not on this machine (did you mean "
                                            "'org/tiny-model'?); looked in:")


def test_fingerprint_is_relocatable_and_content_addressed(hub_cache, prepared_dataset, monkeypatch, tmp_path):
    specs = [SourceConfig(name="b-mc2/sql-create-context"), SourceConfig(name="org/prepared-ds")]
    before = [resolve_source(s).fingerprint() for s in specs]
    assert before[0]["files"][0]["path"] == "sql_create_context_v4.json"
    assert str(tmp_path) not in json.dumps(before)
    moved = tmp_path / "elsewhere" / "hf"
    shutil.copytree(hub_cache.home, moved, symlinks=True)
    monkeypatch.setenv("HF_HOME", str(moved))
    monkeypatch.setenv("HF_HUB_CACHE", str(moved / "hub"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(moved / "datasets"))
    after = [resolve_source(s) for s in specs]
    assert all(moved in s.root.parents for s in after)
    assert [s.fingerprint() for s in after] == before
    blob = after[0].files[0].resolve()  # the blob the snapshot's symlink points at
    data = bytearray(blob.read_bytes())
    data[-2] ^= 1
    blob.write_bytes(bytes(data))
    changed = after[0].fingerprint()
    assert changed["hash"] != before[0]["hash"]
    assert changed["files"][0]["sha256"] != before[0]["files"][0]["sha256"]


def test_model_and_tokenizer_dirs(hub_cache, tmp_path):
    assert resolve_model_dir("org/tiny-model") == hub_cache.model.resolve()
    assert resolve_model_dir("org/tiny-model", revision="main") == hub_cache.model.resolve()
    assert resolve_tokenizer_dir(ModelConfig(name="org/tiny-model")) == hub_cache.model.resolve()
    assert resolve_tokenizer_dir(ModelConfig(name=str(tmp_path), tokenizer="org/tiny-model")) == hub_cache.model.resolve()
    assert resolve_model_dir(str(tmp_path)) == tmp_path
    with pytest.raises(SourceNotFound, match=r"no tokenizer.json in .*save_pretrained"):
        resolve_tokenizer_dir(ModelConfig(name=str(tmp_path)))
    with pytest.raises(SourceNotFound) as e:
        resolve_model_dir("org/missing-model")
    assert f"hub cache {hub_cache.hub} (no models--org--missing-model)" in str(e.value)
    assert "huggingface-cli download org/missing-model" in str(e.value)
    with pytest.raises(SourceNotFound):  # a dataset repo is not a model
        resolve_model_dir("org/parquet-ds")


def test_discover_all_lists_both_caches_in_a_stable_order(hub_cache, prepared_dataset):
    items = discover_all()
    assert [(i["where"], i["type"], i["id"]) for i in items] == [
        ("datasets_cache", "dataset", "org/prepared-ds"),
        ("hub", "dataset", "b-mc2/sql-create-context"),
        ("hub", "dataset", "org/parquet-ds"),
        ("hub", "model", "org/tiny-model"),
    ]
    assert items[0]["splits"] == ["test", "train"]
    assert items[1]["revisions"][0]["commit"] == SQL_COMMIT and items[1]["revisions"][0]["refs"] == ["main"]
    # a hub dataset's splits as datasets names them from its files (issue 47: data/train-00000-of-00001.parquet
    # left SPLITS empty); a model has none
    assert [i.get("splits") for i in items[1:]] == [["train"], ["train", "test"], None]
    table = format_discovery(items)
    assert table.splitlines()[0].split() == ["WHERE", "TYPE", "ID", "REVISION", "/", "CONFIG", "SPLITS", "SIZE", "PATH"]
    assert "org/tiny-model" in table and "cccccccc (main)" in table and "test,train" in table
    assert table.splitlines()[3].split()[:5] == ["hub", "dataset", "org/parquet-ds", PARQUET_COMMIT[:8], "(main)"]
    assert table.splitlines()[3].split()[5] == "train,test"
    assert discover_all() == items


def test_discover_names_the_splits_a_readme_config_gives_or_says_it_cannot(hub_cache):
    configs = ("---\nconfigs:\n- config_name: default\n  data_files:\n  - split: dev\n    path: d/*.jsonl\n"
               "  - split: train\n    path: t/*.jsonl\n---\n")
    write_hub_repo(hub_cache.hub, "dataset", "org/carded", "e" * 40,
                   {"README.md": configs.encode(), "d/a.jsonl": b'{"a": 1}\n', "t/b.jsonl": b'{"a": 2}\n'})
    two = "---\nconfigs:\n- config_name: en\n  data_files: en/*.jsonl\n- config_name: fr\n  data_files: fr/*.jsonl\n---\n"
    write_hub_repo(hub_cache.hub, "dataset", "org/two-configs", "f" * 40,
                   {"README.md": two.encode(), "en/a.jsonl": b'{"a": 1}\n', "fr/b.jsonl": b'{"a": 2}\n'})
    splits = {i["id"]: i.get("splits") for i in discover_all()}
    assert (splits["org/carded"], splits["org/two-configs"]) == (["dev", "train"], ["?"])  # no default: set config:


def test_discover_all_on_empty_caches(hf_home):
    assert discover_all() == []
    assert format_discovery([]).startswith("nothing found in the local HF caches.")


def test_discover_lists_converted_models_and_local_model_directories(hf_home, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from packtrain.cli.commands import main

    models = tmp_path / "models"
    monkeypatch.setenv("PACKTRAIN_MODELS_DIR", str(models))
    converted, killed, mine, half = (models / "smollm2-135m-0123456789abcdef", models / "smollm2-135m-fedcba9876543210",
                                     tmp_path / "my-model", tmp_path / "half-model")
    for folder, files in [(converted, ["config.json", "model.safetensors", "tokenizer.json"]), (killed, ["config.json"]),
                          (mine, ["config.json", "tokenizer.json"]), (half, ["config.json"])]:
        folder.mkdir(parents=True)
        for name in files:
            (folder / name).write_text("{}")
    (converted / "packtrain-source.json").write_text(json.dumps({"model": "smollm2-135m", "gguf": "Small.Q4_1.gguf"}))
    items = discover_all((mine, half))
    assert [(i["where"], i["type"], i["id"], i["detail"]) for i in items] == [
        ("local", "incomplete", str(half), "no tokenizer.json: not usable as model.name"),
        ("local", "model", str(mine), f"--model {mine}"),
        ("packtrain", "incomplete", killed.name,
         "no model.safetensors, tokenizer.json, packtrain-source.json: `packtrain prepare-model EXPERT` converts it again"),
        ("packtrain", "model", "smollm2-135m", "converted from Small.Q4_1.gguf"),
    ]
    table = CliRunner().invoke(main, ["discover", "--model", str(mine)], catch_exceptions=False).output
    assert f"local      model       {mine}" in table and f"packtrain models: {models}" in table
    assert "smollm2-135m" in table and str(converted) in table
