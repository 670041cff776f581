"""Exactness by check, with every real tokenizer the project installs (tests/real_tokenizers.py):

- the shortcuts (the line cache, the fast encoders fastokens and tiktoken) against the HF tokenizer
  on a hostile corpus;
- builds of the bundled samples, of hostile rows and of conversations with each shortcut on and all
  off: the same bytes, and the build's own check says how many documents it compared;
- a shortcut that is wrong (the old line cut, a tampered fast-encoder note) is caught by the build's
  check, never published, dropped for the tokenizer and remembered;
- conversations as transformers' ``apply_chat_template`` renders, tokenizes and masks them.
"""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from build_fixtures import (chat_configs, decided, make_project, packed_documents as documents, sample_lines, seed_decision,
                            write_jsonl)
from hostile_text import hostile_pairs, hostile_texts
from packtrain.core.configfile import load_config
from packtrain.core.contract import Manifest
from packtrain.core.resolve import models_cache_dir
from packtrain.pipeline.encode.fast import exactness, tiktoken_encoder
from packtrain.pipeline.encode import machine_notes
from packtrain.pipeline.orchestrate.build import build
from packtrain.pipeline.encode.fast.line_cache import NEWLINE_RUN_CUT, LineCache, line_cut
from packtrain.pipeline.encode.notes import write_note
from packtrain.pipeline.format.format import RowFormatter
from real_tokenizers import MARKED_SMOLLM2, REAL_TOKENIZERS, hf_tokenizer as hf

SAMPLES = Path(__file__).resolve().parents[1] / "pipeline" / "assets" / "samples"
SHORTCUTS_OFF = {"build.line_cache": False, "build.fast_encoder": False}
# each shortcut alone: (settings, the tokenizers it makes documents for). fastokens by the default
# setting, which tries it first (the explicit `fastokens`: test_fastokens.py); tiktoken by its name
SHORTCUTS = {
    "fastokens": ({"build.fast_encoder": True, "build.line_cache": False}, REAL_TOKENIZERS),
    "tiktoken": ({"build.fast_encoder": "tiktoken", "build.line_cache": False}, ("qwen3",)),
    "line_cache": ({"build.fast_encoder": False, "build.line_cache": True}, REAL_TOKENIZERS),
}


@pytest.mark.parametrize("name", REAL_TOKENIZERS)
def test_the_line_cache_equals_the_hf_tokenizer_on_hostile_text(real_tokenizer, name):
    directory = real_tokenizer(name)
    tokenizer = hf(directory)
    cut, _ = line_cut(json.loads((directory / "tokenizer.json").read_text()))
    assert cut is not None  # all three have a cut: the comparison below is not empty
    pairs = hostile_pairs(seed=0, count=4000)
    cache = LineCache(lambda texts: [e.ids for e in tokenizer.encode_batch(texts, add_special_tokens=False)], cut)
    made = 0
    for (prompt, answer), got in zip(pairs, cache.encode([p for p, _ in pairs], [a for _, a in pairs])):
        if got is not None:
            made += 1
            assert got[0] == tokenizer.encode(prompt + answer, add_special_tokens=False).ids, (prompt, answer)
            assert got[1] == len(tokenizer.encode(prompt, add_special_tokens=False).ids), (prompt, answer)
    assert made > 400


def test_the_hostile_corpus_catches_the_old_line_cut_on_smollm2(real_tokenizer):
    """The corpus can fail: the cut that was argued exact for every byte-level regex is not for GPT-2's."""
    tokenizer = hf(real_tokenizer("smollm2"))
    pairs = hostile_pairs(seed=0, count=2000)
    cache = LineCache(lambda texts: [e.ids for e in tokenizer.encode_batch(texts, add_special_tokens=False)],
                      NEWLINE_RUN_CUT)
    got = cache.encode([p for p, _ in pairs], [a for _, a in pairs])
    differ = sum(g is not None and g[0] != tokenizer.encode(p + a, add_special_tokens=False).ids
                 for (p, a), g in zip(pairs, got))
    assert differ > 100


@pytest.mark.parametrize("name", REAL_TOKENIZERS)
def test_the_fast_encoder_is_admitted_only_where_it_equals_the_hf_tokenizer_on_hostile_text(real_tokenizer, name):
    directory = real_tokenizer(name)
    chosen, why = decided(directory, "tiktoken")  # the build's decision, its proof shared with the builds
    # SmolLM2's vocabulary lacks byte tokens; the converted Qwen2 lists several merges per token
    assert (chosen == "tiktoken") == (name == "qwen3"), why
    if chosen:
        tokenizer = hf(directory)
        encoder = tiktoken_encoder.FastEncoder(json.loads((directory / "tokenizer.json").read_text()), lambda: tokenizer)
        texts = hostile_texts(seed=1, count=4000)
        assert encoder.encode_ids(texts) == [e.ids for e in tokenizer.encode_batch(texts, add_special_tokens=False)]


def expert_config(tmp_path: Path, name: str, directory: Path, overrides: dict | None = None):
    """The shipped expert ``name`` (its template, the bundled sample) on the tokenizer in ``directory``."""
    root = Path(__file__).resolve().parents[1] / "configs"
    return load_config(name, root, {"model.name": str(directory), "build.num_proc": 1, **(overrides or {})})


def shards(result) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(result.path.glob("*.arrow"))}


def quiet(*_):
    pass


@pytest.mark.parametrize("shortcut", SHORTCUTS)
@pytest.mark.parametrize("name", REAL_TOKENIZERS)
def test_the_bundled_samples_build_the_same_bytes_with_each_shortcut_on_and_off(real_tokenizer, tmp_path, name,
                                                                                shortcut):
    directory = real_tokenizer(name)
    settings, makes_for = SHORTCUTS[shortcut]
    seeded(tmp_path / "on", directory, settings)
    for expert in ("sql", "neo4j"):
        on = build(expert_config(tmp_path, expert, directory, {**settings, "build.check_documents": CHECK_FIRST}),
                   tmp_path / "on", log=quiet, progress=False)
        # the same bytes as the HF tokenizer's build: every document (the build's own check re-encoding
        # all 3,000 with the HF tokenizer would only say it again)
        assert shards(on) == reference(tmp_path, expert, directory), (name, expert)
        checked = Manifest.load(on.path, full=True).outputs["exactness"]
        documents = json.loads((on.path / "report.json").read_text())["sources"][0]["documents"]
        # every document was made by the shortcut; the build checked the first CHECK_FIRST and its sample of the rest
        made = 3000 if name in makes_for else 0
        assert checked["by_shortcut"] == made and documents == 3000, (name, expert, checked)
        assert checked["checked"] == (sample_checked(expert) if made else 0), (name, expert, checked)
        fast = shortcut != "line_cache" and name in makes_for
        assert checked["encoders"] == ([shortcut] if fast else ["tokenizers"])
        assert checked["line_cache"] == (shortcut == "line_cache")


CHECK_FIRST = 200  # build.check_documents of the bundled-sample builds above


def sample_checked(expert: str) -> int:
    """How many documents of ``expert``'s bundled sample the build's check re-encodes with
    ``build.check_documents: CHECK_FIRST``: the first CHECK_FIRST rows, then those the keyed hash samples
    (pipeline/encode/fast/exactness.py), as rendered by the expert's template."""
    formatter = RowFormatter(expert_config(None, expert, SAMPLES).format)
    texts = [formatter(json.loads(line)).text for line in sample_lines(expert)]
    assert len(texts) == 3000
    sampled = sum(exactness.sampled(text) for text in texts[CHECK_FIRST:])
    assert 0 < sampled < 20
    return CHECK_FIRST + sampled


def seeded(cache: Path, directory: Path, settings: dict) -> None:
    """A cache holding the fast-encoder decision its first build would make (the decision itself:
    test_reliability_encoder_decision.py, test_fastokens.py)."""
    if settings["build.fast_encoder"]:
        seed_decision(cache, directory, settings["build.fast_encoder"])


REFERENCES: dict = {}  # (tokenizer, expert, settings, data) -> the shards of the build with every shortcut off


def reference(tmp_path: Path, expert: str, directory: Path, settings: dict | None = None, data: Path | None = None
              ) -> dict[str, bytes]:
    """The shards of ``expert``'s build with every shortcut off (the HF tokenizer alone), built once per
    test process for each tokenizer, settings and data (``data``: the source file settings name, by
    content), and checked to be made by no shortcut."""
    by_content = {k: v for k, v in (settings or {}).items() if k != "sources"}  # the source: ``data``'s bytes
    key = (str(directory), expert, json.dumps(by_content, sort_keys=True), data.read_bytes() if data is not None else None)
    if key not in REFERENCES:
        cache = tmp_path / "off"
        off = build(expert_config(tmp_path, expert, directory, {**(settings or {}), **SHORTCUTS_OFF}), cache,
                    log=quiet, progress=False)
        assert Manifest.load(off.path, full=True).outputs["exactness"]["by_shortcut"] == 0
        REFERENCES[key] = shards(off)
    return REFERENCES[key]


def hostile_rows(n: int) -> list[dict]:
    rows = [json.loads(line) for line in sample_lines("sql")[:n]]
    for row, (prompt, answer) in zip(rows, hostile_pairs(seed=3, count=n)):
        row["context"] = prompt + row["context"]
        row["question"] = row["question"] + answer
    return rows


@pytest.mark.parametrize("shortcut", ["fastokens", "line_cache"])
@pytest.mark.parametrize("name", REAL_TOKENIZERS)
def test_hostile_rows_and_chat_style_build_the_same_bytes_with_each_shortcut_on_and_off(real_tokenizer, tmp_path,
                                                                                        name, shortcut):
    directory = real_tokenizer(name)
    data = write_jsonl(tmp_path / "hostile.jsonl", hostile_rows(600))
    seeded(tmp_path / "on", directory, SHORTCUTS[shortcut][0])
    # special: the shortcuts encode the hostile special-token strings as special tokens too; text: the rows holding
    # them are the HF tokenizer's (pipeline/format/special_text.py), the others the shortcut's
    for style, (mode, least) in itertools.product(
            ({"format.style": "template"}, {"format.style": "chat", "format.system": "You write SQL."}),
            (("special", 100), ("text", 50))):
        settings = {"sources": [{"name": str(data)}], "pack.val_fraction": 0.1, **style,
                    "build.special_tokens_in_text": mode}
        on = build(expert_config(tmp_path, "sql", directory, {**settings, **SHORTCUTS[shortcut][0]}), tmp_path / "on",
                   log=quiet, progress=False)
        assert shards(on) == reference(tmp_path, "sql", directory, settings, data), (name, style, mode)
        exact = Manifest.load(on.path, full=True).outputs["exactness"]
        assert exact["by_shortcut"] > least and exact["checked"] == exact["by_shortcut"], (name, style, mode, exact)


def smollm2_project(tmp_path: Path, real_tokenizer, rows: list[dict]) -> dict:
    project = make_project(tmp_path)
    write_jsonl(project["data"], rows)
    config = project["configs"] / "sql.yaml"
    config.write_text(config.read_text().replace(f"name: {project['model']}", f"name: {real_tokenizer('smollm2')}"))
    return project


def test_a_wrong_line_cache_is_caught_never_published_dropped_and_remembered(real_tokenizer, tmp_path, monkeypatch):
    """The old cut (argued exact, wrong for GPT-2's regex) put back: the build's check finds it."""
    rows = [{"question": f"Rows of t{i}?\n\n#{i}", "context": f"CREATE TABLE t{i} (x INT)", "answer": f"SELECT x FROM t{i}"}
            for i in range(40)]
    project = smollm2_project(tmp_path, real_tokenizer, rows)
    reference = build(load_config("sql", project["configs"], SHORTCUTS_OFF), tmp_path / "ref", log=quiet,
                      progress=False)
    real_cut = line_cut
    monkeypatch.setattr("packtrain.pipeline.encode.encoders.line_cut", lambda spec: (NEWLINE_RUN_CUT, "the old cut"))
    monkeypatch.setattr("packtrain.pipeline.encode.encoders.LOADED", {})  # this process's encoders (num_proc 1)
    lines: list[str] = []
    config = load_config("sql", project["configs"], {"build.fast_encoder": False})
    result = build(config, project["cache"], log=lines.append, progress=False)
    assert shards(result) == shards(reference)
    said = [line for line in lines if line.startswith("exactness check:")]
    assert said[1] == "exactness check: no shortcut made a document (the HF tokenizer made every one)"
    assert len(said) == 2 and said[0].startswith(
        "exactness check: line cache differs from the HF tokenizer on row ")
    # "?" "ĊĊ" "#" where SmolLM2's tokenizer has "?" "Ċ" "Ċ" "#"
    assert ": token 21: 1116 where the reference has 198 (33 tokens, the reference 34), in the document starting " \
        "'### Schema\\nCREATE TABLE t0 (x INT)\\n### Question\\nRows of t0?\\n'" in said[0]
    assert said[0].endswith("not using it for this tokenizer again, tokenizing again without it")
    (note,) = (project["cache"] / exactness.LINE_CACHE_NOTES).glob("*.json")
    assert json.loads(note.read_text())["answer"]["on"] is False
    assert Manifest.load(result.path, full=True).outputs["exactness"]["line_cache"] is False
    # the next build with this tokenizer does not try it again, even with the real cut back
    monkeypatch.setattr("packtrain.pipeline.encode.encoders.line_cut", real_cut)
    write_jsonl(project["data"], rows + [{"question": "q", "context": "c", "answer": "a"}])
    lines = []
    build(config, project["cache"], log=lines.append, progress=False)
    assert [line for line in lines if line.startswith("line cache:")] == [
        "line cache: off (an earlier build's check found a difference: " + said[0].removeprefix("exactness check: ")
        .removesuffix("; not using it for this tokenizer again, tokenizing again without it") + ")"]


def test_sources_cached_with_a_shortcut_refused_later_are_tokenized_again(real_tokenizer, tmp_path, monkeypatch):
    """Source a is built with the old line cut and not checked (check_documents 0, none in the sample);
    the next build adds source b, whose check refuses the line cache: a is tokenized again too, and
    every later build, for any expert with this tokenizer, distrusts tokens that shortcut made."""
    bad = [{"question": f"Rows of t{i}?\n\n#{i}", "context": f"CREATE TABLE t{i} (x INT)", "answer": "SELECT x"}
           for i in range(40)]
    project = smollm2_project(tmp_path, real_tokenizer, bad)
    other = write_jsonl(tmp_path / "data" / "b.jsonl", bad[:5])
    a_only = {"build.fast_encoder": False, "build.check_documents": 0}
    # nothing of a falls in the sample
    monkeypatch.setattr(exactness, "sampled_mask", lambda digests: np.zeros(len(digests), bool))
    monkeypatch.setattr("packtrain.pipeline.encode.encoders.line_cut", lambda spec: (NEWLINE_RUN_CUT, "the old cut"))
    monkeypatch.setattr("packtrain.pipeline.encode.encoders.LOADED", {})
    lines: list[str] = []
    build(load_config("sql", project["configs"], a_only), project["cache"], log=lines.append, progress=False)
    assert "exactness check: none of the 40 documents a shortcut made fell in the sample (build.check_documents is " \
           "0 and one in 512 after it)" in lines  # published unchecked: what the sample is for
    both = {**a_only, "build.check_documents": 2048,
            "sources": [{"name": str(project["data"])}, {"name": str(other)}]}
    lines = []
    result = build(load_config("sql", project["configs"], both), project["cache"], log=lines.append, progress=False)
    assert any(line.startswith("exactness check: line cache differs") for line in lines)
    assert f"source {project['data']}: its cached tokens were made with the line cache, which a check has since " \
           "found inexact for this tokenizer: tokenizing it again" in lines
    reference = build(load_config("sql", project["configs"], {**both, **SHORTCUTS_OFF}), tmp_path / "ref", log=quiet,
                      progress=False)
    assert shards(result) == shards(reference)


def reverse_merged_ids(spec: dict) -> None:
    """Give the tokens the merges make their ids in reverse merge order: tiktoken, which merges by id,
    then merges in the opposite order of the HF tokenizer (the proof refuses it)."""
    vocab = spec["model"]["vocab"]
    made = ["".join(m) if isinstance(m, list) else m.replace(" ", "") for m in spec["model"]["merges"]]
    ids = [vocab[token] for token in made]
    for token, new_id in zip(made, reversed(ids)):
        vocab[token] = new_id


def test_a_tampered_fast_encoder_note_is_caught_by_the_check_and_rewritten(tmp_path):
    """A note saying tiktoken is exact for a tokenizer the proof refuses, forged with a valid seal: the build's check catches
    the first document it makes differently, publishes the HF bytes and remembers the refusal."""
    project = make_project(tmp_path, n_rows=120, decided=False)
    tokenizer_json = project["model"] / "tokenizer.json"
    spec = json.loads(tokenizer_json.read_text())
    reverse_merged_ids(spec)
    tokenizer_json.write_text(json.dumps(spec))
    reference = build(load_config("sql", project["configs"], SHORTCUTS_OFF), tmp_path / "ref", log=quiet,
                      progress=False)
    config = load_config("sql", project["configs"], {"build.line_cache": False, "build.fast_encoder": "tiktoken"})
    build(config, project["cache"], log=quiet, progress=False)  # decides (no) and remembers it
    (note,) = (project["cache"] / ".fast-encoder").glob("*.json")
    assert json.loads(note.read_text())["answer"]["encoder"] is None
    # forged with a valid seal (an edited one is not even read: tests/test_reliability_encoder_decision.py), in the
    # cache and in the machine's store (whose refusal would win over the cache's yes)
    about = json.loads(note.read_text())["about"]
    for forged in (note, models_cache_dir() / machine_notes.NOTES / note.name):
        write_note(forged, about, {"encoder": "tiktoken", "why": "tampered", "versions": "x"})
    shutil.rmtree(project["cache"] / "sql")
    lines: list[str] = []
    result = build(config, project["cache"], log=lines.append, progress=False)
    assert "fast encoder: on (tiktoken) (tampered)" in lines
    said = [line for line in lines if line.startswith("exactness check:")]
    assert len(said) == 2 and said[0].startswith("exactness check: fast encoder (tiktoken) differs from the HF tokenizer")
    assert said[1] == "exactness check: no shortcut made a document (the HF tokenizer made every one)"
    assert shards(result) == shards(reference)
    assert json.loads(note.read_text())["answer"]["encoder"] is None
    assert Manifest.load(result.path, full=True).outputs["exactness"]["encoders"] == ["tokenizers"]


def test_a_sample_past_check_documents_is_seeded_by_the_text(tmp_path):
    project = make_project(tmp_path, n_rows=3000)
    result = build(load_config("sql", project["configs"], {"build.check_documents": 32, "build.batch_rows": 1000}),
                   project["cache"], log=quiet, progress=False)
    exact = Manifest.load(result.path, full=True).outputs["exactness"]
    assert exact["by_shortcut"] == 3000
    # the first 32 rows (not their whole batch of 1,000), then the documents whose keyed hash falls in one of 512
    texts = [f"### Schema\n{r['context']}\n### Question\n{r['question']}\n### SQL\n{r['answer']}"
             for r in map(json.loads, project["data"].read_text().splitlines())]
    sampled = sum(exactness.sampled(t) for t in texts[32:])
    assert 0 < sampled < 20 and exact["checked"] == 32 + sampled


def test_check_documents_counts_the_sources_rows_across_batches_and_files_and_filters(tmp_path):
    """The first ``check_documents`` rows of a source as read (in every batch and file, before its
    ``where``): the kept ones among them are checked whole, the rest sampled."""
    project = make_project(tmp_path, n_rows=10)
    records = [json.loads(line) for line in project["data"].read_text().splitlines()]
    data = tmp_path / "data" / "two"
    for part, numbers in (("a", range(0, 7)), ("b", range(7, 40))):
        write_jsonl(data / f"{part}.jsonl", [dict(records[0], question=f"Question {i}?", keep=i % 3 != 1)
                                            for i in numbers])
    overrides = {"build.check_documents": 18, "build.batch_rows": 4,
                 "sources": [{"name": str(data), "where": [{"column": "keep", "equals": True}]}]}
    result = build(load_config("sql", project["configs"], overrides), project["cache"], log=quiet, progress=False)
    exact = Manifest.load(result.path, full=True).outputs["exactness"]
    kept = [i for i in range(40) if i % 3 != 1]
    texts = {i: f"### Schema\n{records[0]['context']}\n### Question\nQuestion {i}?\n### SQL\n{records[0]['answer']}"
             for i in kept}
    assert exact["by_shortcut"] == len(kept) == 27
    # 12 whole (rows 0-17 kept; not the whole batch of rows 15-18, nor counted as if every batch held 4
    # rows, nor as the batch's 18th kept row), then the sample
    assert exact["checked"] == sum(i < 18 or exactness.sampled(texts[i]) for i in kept)


def conversations(n: int) -> list[dict]:
    rows = [json.loads(line) for line in sample_lines("sql")[:n]]
    texts = hostile_texts(seed=5, count=n, max_pieces=8)
    out = []
    for i, (row, hostile) in enumerate(zip(rows, texts)):
        turns = [{"role": "user", "content": f"{row['context']}\n\n{row['question']}"},
                 {"role": "assistant", "content": row["answer"]},
                 {"role": "user", "content": "And again" + hostile},
                 {"role": "assistant", "content": f"```sql\n{row['answer']}\n```" + hostile * (i % 2)}]
        out.append({"messages": ([{"role": "system", "content": "You write SQL."}] if i % 3 == 0 else []) + turns})
    return out


@pytest.mark.parametrize("name", ["smollm2", "qwen3"])
def test_conversations_are_what_apply_chat_template_makes(real_tokenizer, tmp_path, name):
    """Ids as ``apply_chat_template(tokenize=True)`` makes them (up to the newline after the last
    end-of-turn, which is not trained on), and, for SmolLM2's template with generation markers, the
    mask as ``return_assistant_tokens_mask`` makes it."""
    from transformers import AutoTokenizer

    directory = tmp_path / "tok"
    shutil.copytree(real_tokenizer(name), directory)
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    rows = conversations(60)
    # Qwen3's template drops earlier turns' <think> blocks: one exchange each (more turns:
    # format.each_assistant_turn, tests/test_dataset_formats.py)
    if name == "qwen3":
        rows = [{"messages": row["messages"][:-2]} for row in rows]
    if name == "smollm2":  # the marked template renders exactly what SmolLM2's own renders
        for row in rows[:5]:
            assert tokenizer.apply_chat_template(row["messages"], tokenize=False, chat_template=MARKED_SMOLLM2) == \
                tokenizer.apply_chat_template(row["messages"], tokenize=False)
        config = json.loads((directory / "tokenizer_config.json").read_text())
        (directory / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": MARKED_SMOLLM2}))
        (directory / "chat_template.jinja").unlink(missing_ok=True)
    configs = chat_configs(tmp_path, rows, directory, block_size=2048)
    # the hostile turns hold the template's special-token strings, which apply_chat_template encodes as the special
    # tokens (split_special_tokens=False): build.special_tokens_in_text: special (text: tests/test_special_text.py)
    result = build(load_config("chat", configs, {"build.special_tokens_in_text": "special"}), tmp_path / "cache",
                   log=quiet, progress=False)
    built = sorted(documents(result))
    expected = []
    for row in rows:
        marked = {"chat_template": MARKED_SMOLLM2, "return_assistant_tokens_mask": True} if name == "smollm2" else {}
        reference = tokenizer.apply_chat_template(row["messages"], tokenize=True, return_dict=True, **marked)
        ids = list(reference["input_ids"])
        while tokenizer.decode(ids[-1:]).isspace():  # the newline after the last <|im_end|>
            ids.pop()
        mask = list(reference["assistant_masks"][:len(ids)]) if name == "smollm2" else None
        expected.append((ids, mask))
    assert len(built) == len(expected) == 60
    assert [ids for ids, _ in built] == sorted(ids for ids, _ in expected)
    if name == "smollm2":
        assert built == sorted(expected)
        assert all(np.sum(mask) > 0 for _, mask in built)
