"""fastokens, the first fast encoder ``build.fast_encoder: true`` tries: the HF tokenizer's ids and
supervised token ranges with every real tokenizer (tests/real_tokenizers.py) on hostile text and on
conversations; refused where it cannot be exact; and a fastokens that went wrong is caught by the
build's own check, never published, and remembered."""

from __future__ import annotations

import json
import random
import shutil

import numpy as np
import pytest

from build_fixtures import decided, make_project, make_tokenizer, patch_fastokens_wrong
from hostile_text import hostile_pairs, hostile_texts
from packtrain.core.configfile import load_config
from packtrain.core.contract import Manifest
from packtrain.pipeline.orchestrate.build import build
from packtrain.pipeline.encode.fast import fastokens_encoder
from packtrain.pipeline.encode.fast.encoder_decision import choose
from packtrain.pipeline.encode.worker import token_spans
from packtrain.pipeline.format.format import BadRow, Formatted
from real_tokenizers import REAL_TOKENIZERS, hf_tokenizer


def encoders(directory):
    import fastokens

    text = (directory / "tokenizer.json").read_text()
    return (fastokens_encoder.FastokensEncoder(fastokens.Tokenizer.from_json_str(text),
                                               fastokens_encoder.Layout(json.loads(text))),
            hf_tokenizer(directory))


def conversation_like(rng: random.Random, pairs: list[tuple[str, str]]) -> Formatted:
    """A text of several turns with a supervised span per answer, ChatML-style, hostile inside."""
    text, spans = "", []
    for prompt, answer in pairs:
        text += f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
        spans.append((len(text), len(text) + len(answer) + len("<|im_end|>")))
        text += answer + "<|im_end|>" + rng.choice(["\n", "\n\n", ""])
    return Formatted(text, tuple(spans))


@pytest.mark.parametrize("name", REAL_TOKENIZERS)
def test_fastokens_gives_the_hf_ids_and_spans_on_hostile_text(real_tokenizer, name):
    directory = real_tokenizer(name)
    # the decision a build makes (its proof shared with the builds that use it: build_fixtures.decided)
    assert decided(directory) == ("fastokens", "fastokens: the HF tokenizer's ids on the probe text")
    fast, hf = encoders(directory)
    texts = hostile_texts(seed=11, count=3000)
    assert fast.encode_ids(texts, hf) == [e.ids for e in hf.encode_batch(texts, add_special_tokens=False)]
    rng = random.Random(2)
    pairs = hostile_pairs(seed=4, count=1500)
    docs = [Formatted(p + a, ((len(p), len(p + a)),)) for p, a in pairs]
    docs += [conversation_like(rng, pairs[i : i + rng.randint(1, 3)]) for i in range(0, 1500, 3)]
    settled = 0
    for doc, got, encoding in zip(docs, fast.encode_documents(docs),
                                  hf.encode_batch([d.text for d in docs], add_special_tokens=False)):
        if got is None:  # left to the HF tokenizer (NFC would change it, a span inside a token, ...)
            continue
        settled += 1
        assert got[0].dtype == np.uint32 and got[0].tolist() == encoding.ids, doc.text
        try:
            want = token_spans(encoding, doc)
        except BadRow:  # the reference refuses what fastokens placed: never
            pytest.fail(f"fastokens placed the spans of a row the reference refuses: {doc!r}")
        assert got[1] == want, doc
    assert settled > 300  # Qwen's NFC leaves the many non-NFC hostile texts to the HF tokenizer


def test_a_text_with_a_byte_the_vocabulary_lacks_is_left_to_the_hf_tokenizer(real_tokenizer):
    fast, hf = encoders(real_tokenizer("smollm2"))  # SmolLM2's vocabulary has no token for the byte 0xF1
    text = "plane 4: \U00040000 end"
    assert not fast.encodable(text) and fast.encodable("plane 0: é")
    assert fast.encode_documents([Formatted(text, ((9, len(text)),))]) == [None]
    assert fast.encode_ids([text], hf) == [hf.encode(text, add_special_tokens=False).ids]


def test_the_structural_checks_hand_the_encoder_the_token_byte_lengths_they_computed(real_tokenizer, monkeypatch):
    import fastokens

    from packtrain.pipeline.encode.fast import byte_level

    text = (real_tokenizer("qwen3") / "tokenizer.json").read_text()
    spec = json.loads(text)
    problem, lengths = fastokens_encoder.checked(spec)
    assert problem is None and lengths.tolist() == byte_level.token_byte_lengths(spec).tolist()
    assert fastokens_encoder.checked({**spec, "normalizer": {"type": "Lowercase"}}) == (
        "the normalizer Lowercase is neither none nor NFC", None)
    # a worker computes them once (0.1-0.4 CPU s on Qwen3's vocabulary), not again for the encoder
    monkeypatch.setattr(fastokens_encoder, "token_byte_lengths", lambda spec: pytest.fail("computed twice"))
    fast = fastokens_encoder.FastokensEncoder(fastokens.Tokenizer.from_json_str(text), fastokens_encoder.Layout(spec, lengths))
    assert fast.encode_ids(["SELECT 1"]) == [hf_tokenizer(real_tokenizer("qwen3")).encode("SELECT 1", add_special_tokens=False).ids]


@pytest.mark.parametrize("change, why", [
    (lambda s: s.update(normalizer={"type": "Lowercase"}), "the normalizer Lowercase is neither none nor NFC"),
    (lambda s: s["model"].update(dropout=0.1), "dropout"),
    (lambda s: s.update(pre_tokenizer={"type": "Whitespace"}), "the pre-tokenizer is not byte-level"),
    (lambda s: s["model"]["vocab"].update({"▁x": len(s["model"]["vocab"])}), "not in the byte-level alphabet"),
    # each of these moves span edges the token byte lengths cannot see (found by an attack on this code)
    (lambda s: s["pre_tokenizer"].update(add_prefix_space=True), "the pre-tokenizer step ByteLevel adds or removes"),
    (lambda s: s.update(pre_tokenizer={"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"String": "~"}, "behavior": "Removed", "invert": False}, s["pre_tokenizer"]]}),
     "the pre-tokenizer step Split adds or removes text"),
    (lambda s: s["added_tokens"][0].update(rstrip=True), "strips, is single-word or is empty"),
    (lambda s: s.update(post_processor={"type": "Sequence", "processors": [
        {"type": "ByteLevel", "trim_offsets": True, "add_prefix_space": False, "use_regex": True}]}),
     "the post-processor trims offsets"),
])
def test_a_tokenizer_fastokens_cannot_place_spans_for_is_refused(tmp_path, change, why):
    spec = json.loads((make_tokenizer(tmp_path / "model") / "tokenizer.json").read_text())
    change(spec)
    on, reason = fastokens_encoder.decide(json.dumps(spec))
    assert not on and why in reason


def test_a_fastokens_that_differs_on_the_last_piece_of_the_probe_text_is_refused(tmp_path, monkeypatch):
    """Every piece is compared, the last too (the HF tokenizer's ids made and compared 32 pieces at a time)."""
    from packtrain.pipeline.encode.fast.probe import probe_pieces

    text = (make_tokenizer(tmp_path / "model") / "tokenizer.json").read_text()
    real = fastokens_encoder.FastokensEncoder.encode_flat

    def wrong(self, texts):
        ids, offsets = real(self, texts)
        ids = ids.copy()
        ids[offsets[-2]] += 1  # the first id of the last text
        return ids, offsets

    monkeypatch.setattr(fastokens_encoder.FastokensEncoder, "encode_flat", wrong)
    assert fastokens_encoder.decide(text) == (
        False, f"fastokens: it differs from the HF tokenizer on the probe text near {probe_pieces(nfc=False)[-1][:40]!r}")


def test_without_fastokens_the_decision_tries_tiktoken(tmp_path, monkeypatch):
    text = (make_tokenizer(tmp_path / "model") / "tokenizer.json").read_text()
    monkeypatch.setitem(__import__("sys").modules, "fastokens", None)  # import fastokens fails
    told = []
    assert choose(text, ("fastokens", "tiktoken"), told.append) == (
        "tiktoken", "tiktoken: rank BPE equals its merges (GPT-2 byte-level), probe text identical")
    assert told == [("tiktoken", None)]
    told.clear()
    assert choose(text, ("fastokens",), told.append) == (
        None, "fastokens: not installed (pip install fastokens)")
    assert told == [(None, "fastokens: not installed (pip install fastokens)")]


def test_the_setting_fastokens_proves_it_and_builds_the_hf_bytes_with_it(tmp_path):
    """``build.fast_encoder: fastokens`` (fastokens alone; the default, true, tries it first: the real
    tokenizers' builds in test_exactness.py): a first build proves it, then every document is its."""
    project = make_project(tmp_path, decided=False)
    reference = build(load_config("sql", project["configs"], {"build.fast_encoder": False, "build.line_cache": False}),
                      tmp_path / "ref", log=lambda *_: None, progress=False)
    lines: list[str] = []
    result = build(load_config("sql", project["configs"], {"build.fast_encoder": "fastokens", "build.line_cache": False}),
                   project["cache"], log=lines.append, progress=False)
    assert "fast encoder: proven exact (fastokens: the HF tokenizer's ids on the probe text)" in lines
    assert Manifest.load(result.path, full=True).outputs["exactness"] == {
        "by_shortcut": 60, "checked": 60, "encoders": ["fastokens"], "line_cache": False, "render_once": False}
    assert {p.name: p.read_bytes() for p in result.path.glob("*.arrow")} == \
        {p.name: p.read_bytes() for p in reference.path.glob("*.arrow")}


def test_a_wrong_fastokens_is_caught_by_the_build_never_published_and_remembered(tmp_path, monkeypatch):
    """fastokens made to change one id of every tenth document (in this process: one batch, num_proc
    1): the build's check finds the first, publishes the HF tokenizer's bytes and remembers the refusal."""
    project = make_project(tmp_path, n_rows=120)
    reference = build(load_config("sql", project["configs"], {"build.fast_encoder": False, "build.line_cache": False}),
                      tmp_path / "ref", log=lambda *_: None, progress=False)
    config = load_config("sql", project["configs"], {"build.line_cache": False})
    lines: list[str] = []
    with monkeypatch.context() as wrong:
        patch_fastokens_wrong(wrong)
        result = build(config, project["cache"], log=lines.append, progress=False)
    said = [line for line in lines if line.startswith("exactness check:")]
    assert len(said) == 2 and said[0].startswith(
        "exactness check: fast encoder (fastokens) differs from the HF tokenizer on row ")
    assert said[0].endswith("not using it for this tokenizer again, tokenizing again without it")
    assert said[1] == "exactness check: no shortcut made a document (the HF tokenizer made every one)"
    assert {p.name: p.read_bytes() for p in result.path.glob("*.arrow")} == \
        {p.name: p.read_bytes() for p in reference.path.glob("*.arrow")}
    assert Manifest.load(result.path, full=True).outputs["exactness"]["encoders"] == ["tokenizers"]
    (note,) = (project["cache"] / ".fast-encoder").glob("*.json")
    assert json.loads(note.read_text())["answer"]["encoder"] is None
    # the next build asks nothing of any fast encoder, with fastokens right again
    shutil.rmtree(project["cache"] / "sql")
    lines = []
    build(config, project["cache"], log=lines.append, progress=False)
    chosen = [line for line in lines if line.startswith("fast encoder:")]
    assert len(chosen) == 1 and chosen[0].startswith("fast encoder: off (HF tokenizers) (fast encoder (fastokens) "
                                                     "differs from the HF tokenizer on row ")



def test_a_tokenizer_fastokens_cannot_load_is_refused_by_the_decision(tmp_path, monkeypatch):
    """fastokens' own loader refusing a tokenizer the structural checks admit (as it refuses a vocabulary with
    holes: 'model error: unsupported model type: Other') ended the decision's child with the ValueError: the
    decision failed, nothing was remembered, and every build proved it again. It is a refusal, said as a worker's
    load says it (review 54)."""
    import fastokens

    text = (make_tokenizer(tmp_path / "model") / "tokenizer.json").read_text()

    def refuse(text):
        raise ValueError("model error: unsupported model type: Other")

    monkeypatch.setattr(fastokens.Tokenizer, "from_json_str", staticmethod(refuse))
    assert fastokens_encoder.decide(text) == (
        False, "fastokens cannot load this tokenizer (ValueError: model error: unsupported model type: Other)")
