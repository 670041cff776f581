"""Near-duplicates (build.dedup: near) and contamination (build.decontaminate): pipeline/pack/near_dup.py."""

from __future__ import annotations

import json
import random
import shutil

import numpy as np
import pytest

from build_fixtures import make_project, packed_documents, rows, seed_decision, write_jsonl
from packtrain.core.configfile import load_config
from packtrain.pipeline.pack import near_dup
from packtrain.pipeline.pack import near_tables, near_words
from packtrain.pipeline.orchestrate.build import build
from packtrain.pipeline.orchestrate.partition import merge, pretokenize_part
from packtrain.pipeline.pack.spill import PARTS, SOURCES


def quiet(*_):
    pass


def words_of(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """:func:`near_words.word_hashes` of texts, normalized as the token table normalizes a document."""
    table_data, offsets = near_words.token_table(texts)
    sizes = np.diff(offsets)
    return near_words.word_hashes(table_data, np.repeat(np.arange(len(texts)), sizes), len(texts))


def in_memory(texts: dict[str, list[list[tuple[str, str]]]]):
    """``parts`` for near_dup.find over (prompt, answer) pairs per split and source."""

    def parts(split, source, indices):
        chosen = [texts[split][source][i] for i in indices]
        return (*words_of([p for p, _ in chosen]), *words_of([a for _, a in chosen]))

    return parts


def similarity(a: tuple[str, str], b: tuple[str, str]) -> float:
    sets = [near_dup.gram_sets(*words_of([x, y])) for x, y in zip(a, b)]
    return min(near_dup.jaccard(*pair) for pair in sets)


def perturbed(rng: random.Random, prompt: str, answer: str) -> tuple[str, str]:
    kind = rng.choice(["case", "whitespace", "rename", "reorder", "word"])
    if kind == "case":
        return prompt.upper(), answer.lower()
    if kind == "whitespace":
        return "  ".join(prompt.split()), answer.replace(" ", "\n ")
    if kind == "rename":
        table = answer.split(" FROM ")[1].split()[0]
        return prompt.replace(table, table + "_v2"), answer.replace(table, table + "_v2")
    if kind == "reorder":
        head, rest = answer.split(" FROM ")
        columns = head.removeprefix("SELECT ").split(" , ")
        rng.shuffle(columns)
        return prompt, "SELECT " + " , ".join(columns) + " FROM " + rest
    words = prompt.split()
    words[rng.randrange(len(words))] = "changed"
    return " ".join(words), answer


def corpus(seed: int = 7, n: int = 600, copies: int = 300):
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(2000)]

    def row():
        prompt = "Schema: CREATE TABLE t (a, b)\nQuestion: " + " ".join(rng.choice(vocab) for _ in range(rng.randint(6, 24)))
        answer = ("SELECT " + " , ".join(rng.choice(vocab) for _ in range(rng.randint(2, 6))) + " FROM "
                  + rng.choice(vocab) + " WHERE x > " + str(rng.randint(0, 99)))
        return prompt, answer

    train = [row() for _ in range(n)]
    pairs = []
    for i in range(copies):
        pairs.append((i, len(train)))
        train.append(perturbed(rng, *train[i]))
    return train, pairs


def test_recall_at_0_8_and_no_pair_below_the_threshold_dropped():
    train, pairs = corpus()
    texts = {"val": [[]], "train": [train]}
    kept = {"val": [np.arange(0)], "train": [np.arange(len(train))]}
    parts = in_memory(texts)
    found = near_dup.find(parts, near_dup.bands_of(parts), kept, {"val": [0], "train": [len(train)]}, 0.8, False, True)
    dropped = found.dropped["train"][0]
    above = [(i, j) for i, j in pairs if similarity(train[i], train[j]) >= 0.8]
    recall = sum(dropped[j] for _, j in above) / len(above)
    assert len(above) >= 100 and recall >= 0.9, (len(above), recall)
    # every dropped document is a near-duplicate of its pair's first by the exact measure: none below 0.8
    assert found.near == [int(dropped.sum())] and len(found.pairs) == int(dropped.sum())
    for pair in found.pairs:
        a, b = train[pair["document"]["document"]], train[pair["of"]["document"]]
        assert similarity(a, b) >= 0.8 and min(pair["jaccard"].values()) >= 0.8
    assert not dropped[: len(train) - len(pairs)].any()  # the originals are all kept (none is a copy of another)


def spill_of(docs: list[tuple[list[int], list[int]]]):
    """A stand-in for a SourceSpill (pipeline/pack/spill.py) holding ``docs``: (token ids, loss mask) each."""
    from types import SimpleNamespace

    lengths = np.array([len(ids) for ids, _ in docs])
    return SimpleNamespace(tokens=np.concatenate([np.array(ids, np.uint32) for ids, _ in docs]),
                           masks=np.concatenate([np.array(m, np.uint8) for _, m in docs]), lengths=lengths,
                           offsets=np.concatenate([[0], np.cumsum(lengths)[:-1]]))


def test_the_measure_is_pinned_on_literal_documents():
    """The words, signatures and band keys of a few literal token documents, as the first version
    computed them: an optimisation that changes what near dedup finds fails here. The pieces cover a
    special token (""), case, whitespace-only tokens, a piece of two words, a word across tokens and
    across the answer's tokens, non-ASCII letters, and a 130-byte word (past the 64 positions)."""
    pieces = ["", "Select", " COUNT", "(*)", " FROM", "\n\n ", " \u00dcn\u00efcode", "x" * 40, "Y" * 50, "a b",
              " ", "_v2", "SQL\n", "\u00c9"]
    spill = spill_of([([1, 2, 3, 4, 11, 0, 13], [0, 0, 0, 1, 1, 1, 1]),
                      ([0, 7, 8, 7, 10, 9, 5, 12], [0, 0, 0, 0, 0, 1, 1, 1]),
                      ([6, 5, 1, 4, 2, 3], [0, 1, 0, 1, 0, 1]), ([0, 10], [0, 1])])
    words = near_words.SpillWords({"train": [spill]}, near_words.table_units(near_words.token_table(pieces)))
    pw, pc, aw, ac = words("train", 0, np.arange(4))
    assert pc.tolist() == [2, 1, 2, 0] and ac.tolist() == [1, 3, 1, 0]
    assert pw.tolist() == [12282063399829690630, 7257400638884367443, 16271912657117127805, 4639707062649496601,
                           17262266562652516759]
    assert aw.tolist() == [18184667028002229658, 11825466261762436790, 9897417278564598895, 2019926616122178258,
                           17102710092398943917]
    assert pw[0] == words_of(["select"])[0][0] and aw[0] == words_of(["from_v2\u00e9"])[0][0]
    prompt = near_dup.signatures(*near_dup.grams(pw, pc))
    assert prompt[:, :3].tolist() == [[474305159, 2344155699, 4261926968], [2394532569, 2950708484, 2132500376],
                                      [2355910108, 4025493204, 1561704658], [4294967295] * 3]
    keys = near_dup.band_keys(prompt, near_dup.signatures(*near_dup.grams(aw, ac)))
    assert keys[:, :2].tolist() == [[7931602493018334901, 12857807918175617509],
                                    [762259472382194872, 4237534490372229423],
                                    [12004696769599897733, 940009669324409302],
                                    [5640439496769244039, 13778317778509204560]]


@pytest.mark.parametrize("two_words", [True, False])
def test_the_words_of_token_units_are_the_words_of_the_bytes(two_words):
    """SpillWords (one unit per token, a piece range only for a token of two words or more) against
    word_hashes of the documents' bytes, over random documents of tokens that are empty, all space,
    two or three words, spaced on either side, longer than 64 bytes, or not ASCII; every document's
    prompt and answer cut at random places, for consecutive documents (a slice) and every other one."""
    pieces = ["", " ", "  \n", "a", " b", "c ", " d e ", "x" * 70, " " + "y" * 63, "zz", "\u00c9t\u00e9", "q r s",
              "SELECT", "(*)", " 12", "w" * 40]
    if not two_words:  # every token one unit: no piece range at all
        pieces = [p if p.strip().count(" ") == 0 else "v" for p in pieces]
    data, offsets = near_words.token_table(pieces)
    rng = np.random.default_rng(49)
    docs = [(rng.integers(0, len(pieces), n).tolist(), rng.integers(0, 2, n).tolist())
            for n in rng.integers(0, 40, 300)]
    spill = spill_of(docs)
    words = near_words.SpillWords({"train": [spill]}, near_words.table_units((data, offsets)))
    assert words.units.single is not two_words
    for indices in (np.arange(300), np.arange(1, 300, 2)):
        got = words("train", 0, indices)
        for part, (hashes, counts) in enumerate((got[:2], got[2:])):
            chosen = [[t for t, m in zip(*docs[i]) if (m != 0) == part] for i in indices]
            texts = [b"".join(bytes(data[offsets[t]:offsets[t + 1]]) for t in ids) for ids in chosen]
            expected = near_words.word_hashes(np.frombuffer(b"".join(texts), np.uint8),
                                              np.repeat(np.arange(len(texts)), [len(t) for t in texts]), len(texts))
            assert hashes.tolist() == expected[0].tolist() and counts.tolist() == expected[1].tolist()
            assert counts.sum() > 100


@pytest.mark.parametrize("bits", [3, 22])
def test_colliding_finds_the_documents_sharing_a_bucket_and_no_other(bits):
    """The count by top bits only narrows the search: keys equal in their top bits but not in the rest
    (all of them at 3 bits) are no collision, equal keys are, in any band."""
    from collections import Counter

    rng = np.random.default_rng(bits)
    keys = rng.integers(0, 2**64 - 1, (3000, 4), dtype=np.uint64, endpoint=True)
    bands = rng.integers(0, 4, 40)
    keys[rng.integers(0, 3000, 40), bands] = keys[rng.integers(0, 3000, 40), bands]
    keys[:20, 2] = keys[20:40, 2] ^ np.uint64(1)  # the same top bits, other keys
    shared = [Counter(keys[:, b].tolist()) for b in range(4)]
    expected = [p for p in range(3000) if any(shared[b][int(keys[p, b])] > 1 for b in range(4))]
    assert near_dup.colliding(keys, bits).tolist() == expected and 40 <= len(expected) < 3000


def test_case_and_whitespace_changes_are_the_same_grams_renamed_identifiers_are_not():
    base = ("Question: How many heads are older than 56?", "SELECT count(*) FROM head WHERE age > 56")
    assert similarity(base, (base[0].upper(), "select  count(*)\n FROM head   where age > 56")) == 1.0
    renamed = similarity(base, (base[0], "SELECT count(*) FROM heads_v2 WHERE age > 56"))
    assert renamed == pytest.approx(3 / 9)  # 8 words, 6 grams each; the 3 holding the table differ: 3 shared of 9


def test_a_shared_schema_alone_does_not_make_two_questions_duplicates():
    schema = "CREATE TABLE singer (id, name, age, country)\n" * 20
    a = (schema + "How many singers are there?", "SELECT count(*) FROM singer")
    b = (schema + "List the names of singers.", "SELECT name FROM singer")
    texts = {"val": [[]], "train": [[a, b, a]]}
    parts = in_memory(texts)
    found = near_dup.find(parts, near_dup.bands_of(parts), {"val": [np.arange(0)], "train": [np.arange(3)]},
                          {"val": [0], "train": [3]}, 0.8, False, True)
    assert found.dropped["train"][0].tolist() == [False, False, True] and found.clusters == [2]


def sql_project(tmp_path, near_copies: bool = True):
    """A project whose data holds, after 80 rows, a case- and whitespace-changed copy of every
    fourth one (val_fraction 0.2: some originals land in val, some copies in train)."""
    project = make_project(tmp_path, n_rows=80, val_fraction=0.2)
    records = rows(80)
    if near_copies:
        for record in records[::4]:
            records.append({**record, "question": "  ".join(record["question"].upper().split())})
    write_jsonl(project["data"], records)
    return project


def configured(project, **build):
    return load_config("sql", project["configs"], {f"build.{k}": v for k, v in build.items()})


def test_near_dedup_drops_the_copies_and_counts_them(tmp_path):
    project = sql_project(tmp_path)
    exact = build(configured(project), project["cache"], log=quiet, progress=False)
    near = build(configured(project, dedup="near"), project["cache"], log=quiet, progress=False)
    assert near.build_id != exact.build_id
    o = near.report["overlap"]
    assert o["compared"] and o["near_duplicates"] + o["contaminated"] > 0
    trained, kept = len(packed_documents(exact)), len(packed_documents(near))
    assert trained - kept == o["near_duplicates"]  # decontaminate off: contaminated ones stay
    assert o["near_duplicates"] + o["near"] == 20  # each of the 20 copies matches its original once
    assert all(p["document"]["split"] == "train" for p in o["pairs"])
    assert exact.report["overlap"] == {"threshold": None, "decontaminate": False, "val_documents": 22, "exact": 0,
                                       "compared": False}


def test_decontaminate_keeps_every_near_copy_of_a_validation_document_out_of_training(tmp_path):
    project = sql_project(tmp_path)
    result = build(configured(project, decontaminate=True), project["cache"], log=quiet, progress=False)
    o = result.report["overlap"]
    assert o["near"] > 0 and o["contaminated"] == o["near"]
    val_questions = {q for q in questions_of(result, "val")}
    for question in questions_of(result, "train"):
        assert normalized(question) not in {normalized(v) for v in val_questions}


def questions_of(result, split: str) -> list[str]:
    from tokenizers import Tokenizer

    from packtrain.core.contract import Manifest
    from packtrain.core.shardfile import open_shard

    tokenizer = Tokenizer.from_file(str(json.loads((result.path / "manifest.json").read_text())["inputs"]["tokenizer"]
                                        ["source"]) + "/tokenizer.json")
    block = Manifest.load(result.path).block_size
    out = []
    for shard in sorted(result.path.glob(f"{split}-*.arrow")):
        ids, _, doc_lens = open_shard(shard, block).arrays()
        for row, lens in zip(ids, doc_lens):
            at = 0
            for n in lens:
                text = tokenizer.decode(row[at : at + n].tolist())
                out.append(text.split("Question")[-1].split("SQL")[0])
                at += n
    return out


def normalized(text: str) -> str:
    return " ".join(text.lower().split())


def test_the_same_bytes_for_one_and_two_processes_and_for_three_parts(tmp_path):
    project = sql_project(tmp_path)
    shards = []
    for num_proc in (1, 2):
        cache = tmp_path / f"cache{num_proc}"
        seed_decision(cache, project["model"])
        result = build(configured(project, dedup="near", num_proc=num_proc, batch_rows=16), cache, log=quiet,
                       progress=False)
        shards.append({p.name: p.read_bytes() for p in sorted(result.path.glob("*.arrow"))})
    for i in range(3):
        machine = tmp_path / f"machine{i}"
        seed_decision(machine, project["model"])
        pretokenize_part(configured(project, dedup="near", batch_rows=16), machine, (i, 3), log=quiet)
        shutil.copytree(machine / "sql" / SOURCES / PARTS, project["cache"] / "sql" / SOURCES / PARTS, dirs_exist_ok=True)
    merged = merge(configured(project, dedup="near", batch_rows=16), project["cache"], 3, log=quiet)
    shards.append({p.name: p.read_bytes() for p in sorted(merged.path.glob("*.arrow"))})
    assert shards[0] == shards[1] == shards[2]
    assert merged.report["overlap"]["near_duplicates"] > 0


def test_the_token_table_store_changes_no_byte(tmp_path, monkeypatch):
    """The machine's store of token tables (pipeline/pack/near_tables.py): the same shards with it off,
    cold (the table made and kept) and warm (read back: the table is not made again), and a damaged
    table in it is made again and written over whole."""
    project = sql_project(tmp_path)
    store = tmp_path / "tables"
    made = []
    tokenizer_table = near_words.tokenizer_table
    monkeypatch.setattr(near_words, "tokenizer_table", lambda *a: made.append(1) or tokenizer_table(*a))
    shards = {}
    for name, value in (("off", "off"), ("cold", str(store)), ("warm", str(store)), ("damaged", str(store))):
        monkeypatch.setenv(near_tables.STORE_VARIABLE, value)
        if name == "damaged":
            table.write_bytes(table.read_bytes()[:-100])
        cache = tmp_path / f"cache-{name}"
        seed_decision(cache, project["model"])
        result = build(configured(project, dedup="near"), cache, log=quiet, progress=False)
        shards[name] = {p.name: p.read_bytes() for p in sorted(result.path.glob("*.arrow"))}
        assert result.report["overlap"]["near_duplicates"] > 0
        if name == "cold":
            (table,) = store.iterdir()
            whole = table.read_bytes()
    assert shards["off"] == shards["cold"] == shards["warm"] == shards["damaged"]
    assert len(made) == 3  # off, cold, damaged: warm read it
    assert table.read_bytes() == whole and list(store.iterdir()) == [table]


def test_the_build_id_holds_the_threshold_and_decontaminate_only_where_used(tmp_path):
    from packtrain.pipeline.orchestrate.build import plan_inputs

    project = sql_project(tmp_path, near_copies=False)
    inputs = {name: plan_inputs(configured(project, **build))[2] for name, build in {
        "exact": {}, "exact-other-threshold": {"dedup_threshold": 0.9}, "near": {"dedup": "near"},
        "near-0.9": {"dedup": "near", "dedup_threshold": 0.9}, "decontaminate": {"decontaminate": True}}.items()}
    assert "near_dedup" not in inputs["exact"] and inputs["exact"] == inputs["exact-other-threshold"]
    assert inputs["near"]["near_dedup"] == {"threshold": 0.8, "method": near_dup.METHOD, "decontaminate": False}
    assert inputs["near-0.9"]["near_dedup"]["threshold"] == 0.9
    assert inputs["decontaminate"]["near_dedup"]["decontaminate"] is True and inputs["decontaminate"]["dedup"] == "exact"


def test_inspect_dropped_lists_each_pair_with_both_texts_and_the_plot_is_drawn(tmp_path):
    from inprocess_cli import cli

    project = sql_project(tmp_path)
    result = build(configured(project, dedup="near"), project["cache"], log=quiet, progress=False)
    shown = cli("inspect", "sql", "--dropped", "--cache-dir", project["cache"])
    assert shown.returncode == 0, shown.stderr
    o = result.report["overlap"]
    assert f"{o['near_duplicates']:,} near-duplicates dropped" in shown.stdout
    assert shown.stdout.count("\n── ") == o["pairs_total"] == len(o["pairs"]) > 0
    first = o["pairs"][0]
    assert repr(first["document"]["answer_start"][:80]) in shown.stdout
    from packtrain.pipeline.review.plots import write_build_plots

    assert "overlap.png" in [p.name for p in write_build_plots(result.path)]


def test_verify_says_what_was_removed_and_why(tmp_path):
    from inprocess_cli import cli

    project = sql_project(tmp_path)
    result = build(configured(project, dedup="near", decontaminate=True), project["cache"], log=quiet, progress=False)
    o = result.report["overlap"]
    shown = cli("verify", "sql", "--cache-dir", project["cache"])
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[1] == (
        f"removed before packing: 0 exact duplicates (build.dedup: near), {o['near_duplicates']:,} near-duplicates, "
        f"{o['contaminated']:,} training documents matching validation (removed; threshold 0.8): "
        "`packtrain inspect sql --dropped` lists them")


def test_an_eval_source_is_compared_with_training_and_decontaminate_keeps_its_rows_out(tmp_path):
    """Issue 49's done-when, on a small scale: dev (an eval source) holds near copies (case, spacing)
    of 10 training rows and 10 rows of its own; the report counts the overlap per eval set, and with
    decontaminate no training block holds those rows."""
    project = sql_project(tmp_path, near_copies=False)
    train = rows(80)
    dev = [{**r, "question": "  ".join(r["question"].upper().split())} for r in train[:40:4]] + rows(10, start=500)
    dev_file = write_jsonl(tmp_path / "data" / "dev.jsonl", dev)
    sources = [{"name": str(project["data"])}, {"name": str(dev_file), "role": "eval"}]
    kept = build(load_config("sql", project["configs"], {"sources": sources, "pack.val_fraction": 0, "build.dedup": "near"}),
                 project["cache"], log=quiet, progress=False)
    o = kept.report["overlap"]
    assert o["eval_sets"] == [{"name": "dev.jsonl", "documents": 20, "exact": 0, "near": 10}]
    assert o["contaminated"] == 10 and not o["decontaminate"] and len(packed_documents(kept)) == 80
    clean = build(load_config("sql", project["configs"], {"sources": sources, "pack.val_fraction": 0,
                                                           "build.dedup": "near", "build.decontaminate": True}),
                  project["cache"], log=quiet, progress=False)
    assert clean.build_id != kept.build_id and len(packed_documents(clean)) == 70
    dev_questions = {normalized(q) for q in questions_of(clean, "val")}
    assert len(dev_questions) == 20
    assert not dev_questions & {normalized(q) for q in questions_of(clean, "train")}
