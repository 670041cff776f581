"""The offline build end to end: shards, manifest, determinism, no-op rebuilds, crash safety."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from tokenizers import Tokenizer

import packtrain.pipeline.orchestrate.build
import packtrain.pipeline.encode.source_caches
from build_fixtures import empty_cache, make_project, make_tokenizer, rows, write_jsonl
from packtrain.pipeline.orchestrate.build import build
from packtrain.pipeline.errors import BuildError
from packtrain.core.configfile import load_config
from packtrain.core.files import replacing
from packtrain.core.shardfile import open_shard
from packtrain.pipeline.pack.spill import SOURCE_FILES
from packtrain.core.contract import (
    Manifest,
    read_current,
    resolve_build,
    verify_checksums,
)

ROOT = Path(__file__).resolve().parents[1]


def quiet(*_):
    pass


@pytest.fixture
def project(tmp_path):
    return make_project(tmp_path)


def run_build(project, **overrides):
    config = load_config("sql", project["configs"], overrides)
    return build(config, project["cache"], log=quiet, progress=False)


def shard_bytes(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.glob("*.arrow"))}


def test_build_writes_the_contract(project):
    result = run_build(project)
    manifest = Manifest.load(result.path)
    assert manifest.build_id == result.build_id == read_current(project["cache"], "sql")
    assert manifest.block_size == 128 and manifest.token_dtype == "uint16"
    assert (manifest.eos_id, manifest.pad_id, manifest.vocab_size) == (0, 1, 400)
    assert verify_checksums(result.path, manifest) == []
    totals = manifest.outputs["totals"]
    assert totals["train"]["documents"] + totals["val"]["documents"] == 60

    schema = pa.ipc.open_stream(pa.memory_map(str(result.path / manifest.train[0].file))).schema
    assert schema.field("input_ids").type == pa.list_(pa.uint16(), 128)
    ids, mask, doc_lens = open_shard(result.path / manifest.train[0].file, 128).arrays()
    assert ids.shape == (manifest.train[0].rows, 128) and ids.dtype == np.uint16
    tokenizer = Tokenizer.from_file(str(project["model"] / "tokenizer.json"))
    texts = {r["answer"] for r in rows(60)}
    supervised = 0
    for row in range(len(ids)):
        lens = doc_lens[row]
        at = 0
        for n in lens:
            doc, doc_mask = ids[row, at:at + n], mask[row, at:at + n]
            assert doc[-1] == 0 and doc_mask[-1] == 1  # eos ends every document and is supervised
            assert doc_mask[0] == 0  # a document start is never a target
            answer = tokenizer.decode(doc[doc_mask == 1].tolist()[:-1])
            assert answer in texts
            at += n
        assert (ids[row, at:] == 1).all() and (mask[row, at:] == 0).all()  # padding: pad id, unsupervised
        supervised += int(mask[row].sum())
    assert supervised == sum(int(m.sum()) for m in [mask])


def test_shards_open_with_datasets_and_memory_map(project):
    import datasets

    result = run_build(project)
    shard = result.path / "train-00000.arrow"
    ds = datasets.Dataset.from_file(str(shard))
    assert ds.column_names == ["input_ids", "loss_mask", "doc_lens"]
    assert len(ds[0]["input_ids"]) == 128
    with pa.memory_map(str(shard)) as source:
        table = pa.ipc.open_stream(source).read_all()
    assert table.num_rows == ds.num_rows


def test_first_block_literal_content(tmp_path):
    # three short documents, one block of 64 tokens: bfd puts them together, longest first
    project = make_project(tmp_path, n_rows=3, block_size=64, val_fraction=0.0)
    project_rows = rows(3)
    write_jsonl(project["data"], [{"question": "q", "context": "c", "answer": r["answer"][:12]} for r in project_rows])
    result = run_build(project, **{"build.dedup": "none"})  # the three documents are the same text
    ids, mask, doc_lens = open_shard(result.path / "train-00000.arrow", 64).arrays()
    tokenizer = Tokenizer.from_file(str(project["model"] / "tokenizer.json"))
    doc = ids[0, : doc_lens[0][0]].tolist()
    assert tokenizer.decode(doc, skip_special_tokens=False) == "### Schema\nc\n### Question\nq\n### SQL\nSELECT COUNT<|endoftext|>"
    assert doc_lens == [[len(doc)] * 3]
    assert len(ids) == 1


def source_caches(build: Path) -> dict[str, bytes]:
    """Every file of the build's source token caches (.sources/<key>/, those with a stats.json), by name."""
    return {f"{d.name}/{f.name}": f.read_bytes() for d in sorted((build.parent / ".sources").iterdir())
            if (d / "stats.json").is_file() for f in sorted(d.iterdir())}


def test_num_proc_does_not_change_the_bytes(project, tmp_path):
    """Nor the source caches (the workers write their batches' tokens into them: pipeline/pack/spill.py),
    nor the report's counts (60 rows, 16 a batch: 4 batches, 2 workers)."""
    one = run_build(project, **{"build.num_proc": 1})
    saved, caches = shard_bytes(one.path), source_caches(one.path)
    manifest = (one.path / "manifest.json").read_bytes()
    report = json.loads((one.path / "report.json").read_text())
    empty_cache(project)
    two = run_build(project, **{"build.num_proc": 2})
    assert two.build_id == one.build_id
    assert shard_bytes(two.path) == saved
    assert (two.path / "manifest.json").read_bytes() == manifest
    assert source_caches(two.path) == caches and len(caches) == len(SOURCE_FILES) + 1
    counted = json.loads((two.path / "report.json").read_text())
    assert counted["processes"] == 2 and counted["sources"] == report["sources"]
    assert counted["sources"][0]["tokens"] == report["train"]["document_tokens"] + report["val"]["document_tokens"] > 0


def test_manifest_is_byte_identical_across_rebuilds(project):
    first = run_build(project)
    manifest = (first.path / "manifest.json").read_bytes()
    empty_cache(project)
    second = run_build(project)
    assert (second.path / "manifest.json").read_bytes() == manifest


def test_second_run_is_a_no_op(project, monkeypatch):
    first = run_build(project)
    def fail(*_, **__):
        raise AssertionError("tokenized again")
    monkeypatch.setattr(packtrain.pipeline.encode.source_caches, "encode_stream", fail)
    second = run_build(project)
    assert second.up_to_date and second.build_id == first.build_id


def test_a_changed_byte_or_tokenizer_gives_a_new_build(project, tmp_path):
    base = run_build(project).build_id
    data = project["data"]
    original = data.read_bytes()
    data.write_bytes(original.replace(b"t0 ", b"t9 ", 1))
    changed_data = run_build(project).build_id
    data.write_bytes(original)
    assert run_build(project).build_id == base  # back to the same inputs, back to the same build
    make_tokenizer(project["model"], extra_special=["<|extra|>"])
    changed_tokenizer = run_build(project).build_id
    assert len({base, changed_data, changed_tokenizer}) == 3
    assert read_current(project["cache"], "sql") == changed_tokenizer


def test_touching_mtime_or_moving_the_project_keeps_the_build_id(project, tmp_path):
    base = run_build(project).build_id
    os.utime(project["data"], (1, 1))
    assert run_build(project).build_id == base


@pytest.mark.parametrize("point", ["mid_tokenize", "after_shards", "after_manifest", "before_rename", "after_rename"])
def test_kill_9_leaves_current_valid(project, point):
    old = run_build(project, **{"pack.val_fraction": 0.2})  # different tokens: the rerun must tokenize
    script = (
        "import sys; sys.path.insert(0, %r)\n"
        "from packtrain.core.configfile import load_config\nfrom packtrain.pipeline.orchestrate.build import build\n"
        "build(load_config('sql', %r), %r, log=lambda *a: None, progress=False)\n"
    ) % (str(ROOT), str(project["configs"]), str(project["cache"]))
    env = dict(os.environ, PACKTRAIN_CRASH_AT=point)
    proc = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    current = read_current(project["cache"], "sql")
    # CURRENT names a complete build: the old one, or (killed after the rename) the new one
    assert current == old.build_id or point == "after_rename"
    assert verify_checksums(resolve_build(project["cache"], "sql"), Manifest.load(resolve_build(project["cache"], "sql"))) == []
    new = run_build(project)
    assert not list((project["cache"] / "sql").glob(".tmp-*"))  # leftovers cleaned
    reference = shard_bytes(new.path)
    empty_cache(project)
    assert shard_bytes(run_build(project).path) == reference


def test_bad_rows_are_skipped_and_counted_or_fail(project):
    records = rows(20)
    records[3]["answer"] = None
    records[7].pop("question")
    write_jsonl(project["data"], records)
    result = run_build(project)
    report = json.loads((result.path / "report.json").read_text())
    assert report["bad_rows"] == 2
    first = report["sources"][0]["first_bad_rows"]
    assert [b["row"].rsplit(":", 1)[1] for b in first] == ["sql.jsonl#3", "sql.jsonl#7"]
    assert first[0]["reason"] == "field 'answer' is null"
    with pytest.raises(BuildError, match=r"bad row .*sql.jsonl#3: field 'answer' is null"):
        run_build(project, **{"build.on_bad_rows": "error"})


def test_validation_split_is_stable_when_data_is_appended(project):
    first = run_build(project, **{"pack.val_fraction": 0.3})
    val_before = decoded_answers(first.path, "val", project)
    write_jsonl(project["data"], rows(60) + rows(40, start=1000))
    second = run_build(project, **{"pack.val_fraction": 0.3})
    assert val_before and val_before <= decoded_answers(second.path, "val", project)
    assert not (val_before & decoded_answers(second.path, "train", project))


def decoded_answers(path: Path, split: str, project) -> set[str]:
    tokenizer = Tokenizer.from_file(str(project["model"] / "tokenizer.json"))
    manifest = Manifest.load(path)
    answers = set()
    for shard in (manifest.train if split == "train" else manifest.val):
        ids, mask, _ = open_shard(path / shard.file, manifest.block_size).arrays()
        for row in range(len(ids)):
            answers.update(t for t in tokenizer.decode(ids[row][mask[row] == 1].tolist(), skip_special_tokens=False)
                           .split("<|endoftext|>") if t)
    return answers


def test_wrap_strategy_and_overlong_documents(project):
    result = run_build(project, **{"pack.strategy": "wrap", "pack.block_size": 32})
    totals = Manifest.load(result.path).outputs["totals"]["train"]
    assert totals["packing_efficiency"] > 0.95  # only the last block is partial
    split = run_build(project, **{"pack.block_size": 48, "pack.overlong": "split"})
    report = Manifest.load(split.path).outputs["totals"]["train"]
    assert report["overlong"] > 0 and report["split"] == report["overlong"]
    dropped = run_build(project, **{"pack.block_size": 48, "pack.overlong": "drop"})
    report = Manifest.load(dropped.path).outputs["totals"]["train"]
    assert report["dropped_overlong"] == report["overlong"] > 0


def test_chat_style_masks_the_rendered_prompt(project):
    result = run_build(project, **{"format.style": "chat", "format.system": "You write SQL."})
    tokenizer = Tokenizer.from_file(str(project["model"] / "tokenizer.json"))
    ids, mask, doc_lens = open_shard(result.path / "train-00000.arrow", Manifest.load(result.path).block_size).arrays()
    n = doc_lens[0][0]
    text = tokenizer.decode(ids[0, :n].tolist(), skip_special_tokens=False)
    assert text.startswith("<|im_start|>system\nYou write SQL.<|im_end|>\n<|im_start|>user\n### Schema")
    answer = tokenizer.decode(ids[0, :n][mask[0, :n] == 1].tolist(), skip_special_tokens=False)
    assert answer.startswith("SELECT COUNT(*)") and answer.endswith("<|im_end|>\n<|endoftext|>")


def test_no_training_blocks_says_where_the_documents_went(project):
    """Rows that made documents, none of them packed for training: every one held out for validation, every
    training one dropped as a near copy of a validation one, or every one longer than the block. The line said
    '0 of N rows were bad (the sources have no rows); check the sources and the format templates'; it says
    where they went and the setting to change (the counts are those the builds that do pack report)."""
    with pytest.raises(BuildError, match=r"^the build of 'sql' has no training blocks: 0 of 60 rows were bad \(all 60 "
                       r"documents went to validation: pack\.val_fraction is 0\.999999\); lower pack\.val_fraction$"):
        run_build(project, **{"pack.val_fraction": 0.999999})

    first = rows(1)[0]
    write_jsonl(project["data"], [dict(first, question=first["question"] + " " * i) for i in range(40)])
    found = run_build(project, **{"pack.val_fraction": 0.5, "build.dedup": "near"}).report
    before = found["sources"][0]["mix"]["train"]["documents_before"]
    assert 0 < before == found["overlap"]["contaminated"]  # every training document nears a validation one
    with pytest.raises(BuildError, match=rf"^the build of 'sql' has no training blocks: 0 of 40 rows were bad \(all "
                       rf"{before} training documents were dropped: {before} near copies of validation documents "
                       rf"\(build\.decontaminate\)\); add training data unlike the validation data, or loosen those "
                       rf"settings$"):
        run_build(project, **{"pack.val_fraction": 0.5, "build.dedup": "near", "build.decontaminate": True})

    write_jsonl(project["data"], rows(30))
    split = run_build(project, **{"pack.block_size": 16}).report["train"]
    assert split["documents"] == split["overlong"] > 0
    with pytest.raises(BuildError, match=rf"^the build of 'sql' has no training blocks: 0 of 30 rows were bad \(all "
                       rf"{split['documents']} training documents were dropped when packed: {split['documents']} longer "
                       rf"than pack\.block_size 16 \(pack\.overlong: drop\)\); set pack\.overlong: split or truncate, "
                       rf"or raise pack\.block_size$"):
        run_build(project, **{"pack.block_size": 16, "pack.overlong": "drop"})


def test_no_training_blocks_where_only_the_eval_sources_made_documents(project):
    sources = [{"name": str(project["data"]), "role": "eval"},
               {"name": str(project["data"]), "where": [{"column": "answer", "equals": "none"}]}]
    with pytest.raises(BuildError, match=r"^the build of 'sql' has no training blocks: 0 of 120 rows were bad, 60 "
                       r"filtered out by sources\[\]\.where \(sources\[1\]\.where kept none of its 60 rows; all 60 "
                       r"documents are of sources with role: eval, which are validation only\); loosen its conditions to "
                       r"match the values the column holds$"):
        run_build(project, **{"sources": sources, "pack.val_fraction": 0.0})


def test_a_build_with_no_usable_rows_fails_and_keeps_current(project):
    good = run_build(project)
    write_jsonl(project["data"], [{"question": "q", "context": "c", "answer": None}])
    with pytest.raises(BuildError, match=r"no training blocks: 1 of 1 rows were bad \(.*sql.jsonl:sql.jsonl#0: field 'answer' is null\)"):
        run_build(project)
    assert read_current(project["cache"], "sql") == good.build_id
    assert not list((project["cache"] / "sql").glob(".tmp-*"))


def with_bos_post_processor(model_dir: Path) -> None:
    """Make the fixture tokenizer Llama-like: its post-processor puts <s> (the BOS) first."""
    from tokenizers import processors

    make_tokenizer(model_dir, extra_special=["<s>"])
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
    tok.save(str(model_dir / "tokenizer.json"))
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    config.update(bos_token="<s>",
                  chat_template="{{ bos_token }}" + config["chat_template"])  # Llama-2 style: the template renders BOS
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config))


def first_doc(result) -> list[int]:
    ids, _, doc_lens = open_shard(result.path / "train-00000.arrow", Manifest.load(result.path).block_size).arrays()
    return ids[0, : doc_lens[0][0]].tolist()


def test_bos_from_the_post_processor_once_in_both_styles(project):
    with_bos_post_processor(project["model"])
    bos = Tokenizer.from_file(str(project["model"] / "tokenizer.json")).token_to_id("<s>")
    template = first_doc(run_build(project))
    assert template[0] == bos and template[1] != bos  # as AutoTokenizer would encode it
    chat = first_doc(run_build(project, **{"format.style": "chat"}))
    assert chat[0] == bos and chat[1] != bos  # the template's own BOS, not a second one


def test_chat_turn_ending_with_eos_gets_no_second_eos(project):
    config = json.loads((project["model"] / "tokenizer_config.json").read_text())
    (project["model"] / "tokenizer_config.json").write_text(json.dumps({**config, "eos_token": "<|im_end|>"}))
    tokenizer = Tokenizer.from_file(str(project["model"] / "tokenizer.json"))
    doc = first_doc(run_build(project, **{"format.style": "chat"}))
    assert doc[-1] == tokenizer.token_to_id("<|im_end|>") and doc[-2] != doc[-1]


def test_chat_style_without_a_usable_template_fails_before_tokenizing(project):
    config = json.loads((project["model"] / "tokenizer_config.json").read_text())
    (project["model"] / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": "{% if %}"}))
    with pytest.raises(BuildError, match="chat template of .* does not compile"):
        run_build(project, **{"format.style": "chat"})
    del config["chat_template"]
    (project["model"] / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(BuildError, match="has no chat_template"):
        run_build(project, **{"format.style": "chat"})


def test_a_source_listed_twice_is_upsampled_only_without_dedup(project):
    once = json.loads((run_build(project).path / "report.json").read_text())
    twice = [{"name": str(project["data"])}, {"name": str(project["data"])}]
    report = json.loads((run_build(project, sources=twice, **{"build.dedup": "none"}).path / "report.json").read_text())
    docs = lambda r: r["train"]["documents"] + r["val"]["documents"]
    assert docs(report) == 2 * docs(once) == 120
    assert [s["reused"] for s in report["sources"]] == [True, True]  # tokenized by the first build
    deduped = json.loads((run_build(project, sources=twice).path / "report.json").read_text())
    assert docs(deduped) == 60 and deduped["duplicates"] == 60  # dedup: exact (the default) packs each once


def test_the_spelling_of_a_local_path_does_not_change_the_build_id(project, monkeypatch):
    monkeypatch.chdir(project["data"].parent)
    ids = {run_build(project, sources=[{"name": spelling}]).build_id
           for spelling in (str(project["data"]), "sql.jsonl", "./sql.jsonl", "../data/sql.jsonl")}
    assert len(ids) == 1


def test_a_dead_writers_temporary_facts_note_is_removed_a_live_ones_kept(project):
    """Notes are written outside the expert's lock (the tokenizer facts while planning, the cache's
    shared notes, a part's identity): a build killed while writing one leaves its temporary file, which
    the next build removes; one of a process still running is its own."""
    run_build(project)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    notes = [project["cache"] / "sql" / ".sources" / ".tokenizer-facts", project["cache"] / ".fast-encoder"]
    # the names as core/files.temporary_path makes them (-<pid>-<random>), and the older -<pid>
    left = [directory / f".tmp-{'0' * 16}.json-{dead.pid}-0a1b2c3d" for directory in notes]
    live = [directory / f".tmp-{'1' * 16}.json-{os.getppid()}-0a1b2c3d" for directory in notes]
    # a random part of digits only (2.3% of them) is not a pid: the writer is the parent, alive
    live += [directory / f".tmp-{'4' * 16}.json-{os.getppid()}-20251127" for directory in notes]
    # this very process's pid, nobody here writing it: a killed process's whose pid came again (pid 1)
    left += [directory / f".tmp-{'3' * 16}.json-{os.getpid()}-0a1b2c3d" for directory in notes]
    part = project["cache"] / "sql" / ".sources" / ".parts" / ("2" * 16)  # a part's identity note (`--part i/N`)
    part.mkdir(parents=True)
    left.append(part / f".tmp-identity.json-{dead.pid}")
    live.append(part / f".tmp-identity.json-{os.getppid()}")
    for path in left + live:
        path.write_text("{")
    # one this process is writing now (another thread's, in a program that builds two experts at once)
    with replacing(notes[0] / f"{'5' * 16}.json") as writing:
        writing.write_text("{")
        run_build(project, **{"pack.val_fraction": 0.2})
        assert writing.exists()
    assert [path.exists() for path in left] == [False] * 5
    assert [path.exists() for path in live] == [True] * 5
