"""Normalizers and pre-tokenizers judged by what they do (pipeline/encode/tokenizer_shape.py): a
tokenizer.json written with an empty normalizer Sequence, a Sequence holding only NFC, nested
pre-tokenizer Sequences or a Sequence of one step is admitted to the fast path as the plain form is,
and builds the HF tokenizer's bytes with it; a Sequence holding a real normalizer stays refused, with
the one-line reason it had. The shapes are the real tokenizers (tests/real_tokenizers.py) rewritten."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from build_fixtures import write_jsonl
from packtrain.core.contract import Manifest
from packtrain.pipeline.orchestrate.build import build
from packtrain.pipeline.encode import encoders
from packtrain.pipeline.encode.fast import fastokens_encoder, tiktoken_encoder
from packtrain.pipeline.encode.fast.encoder_decision import choose
from packtrain.pipeline.encode.fast.line_cache import LONE_NEWLINE_CUT, NEWLINE_RUN_CUT, line_cut
from real_tokenizers import hf_tokenizer
from test_exactness import expert_config, hostile_rows, shards


def nested(spec: dict) -> None:
    """Qwen's Sequence [Split, ByteLevel] as [Sequence [Split], Sequence [Sequence [ByteLevel]]]."""
    split, level = spec["pre_tokenizer"]["pretokenizers"]
    spec["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Sequence", "pretokenizers": [split]},
        {"type": "Sequence", "pretokenizers": [{"type": "Sequence", "pretokenizers": [level]}]}]}


# shape -> (the real tokenizer it rewrites, the rewrite, the line cut its plain form has)
ADMITTED = {
    "empty normalizer Sequence": ("smollm2", lambda s: s.update(normalizer={"type": "Sequence", "normalizers": []}),
                                  LONE_NEWLINE_CUT),
    "normalizer Sequence of NFC": ("qwen3", lambda s: s.update(normalizer={"type": "Sequence", "normalizers": [
        {"type": "NFC"}, {"type": "Sequence", "normalizers": [{"type": "NFC"}]}]}), NEWLINE_RUN_CUT),
    "nested pre-tokenizer Sequences": ("qwen3", nested, NEWLINE_RUN_CUT),
    "pre-tokenizer Sequence of one ByteLevel": ("smollm2", lambda s: s.update(pre_tokenizer={
        "type": "Sequence", "pretokenizers": [s["pre_tokenizer"]]}), LONE_NEWLINE_CUT),
}


def rewritten(real_tokenizer, tmp_path: Path, name: str, change) -> Path:
    """A copy of the real tokenizer ``name``'s directory with its tokenizer.json rewritten by ``change``."""
    directory = tmp_path / f"{name}-rewritten"
    shutil.copytree(real_tokenizer(name), directory)
    spec = json.loads((directory / "tokenizer.json").read_text())
    change(spec)
    (directory / "tokenizer.json").write_text(json.dumps(spec))
    return directory


@pytest.mark.parametrize("shape", ADMITTED)
def test_a_shape_that_does_what_the_plain_form_does_is_judged_as_the_plain_form(real_tokenizer, shape):
    """By fastokens, by tiktoken (SmolLM2's vocabulary lacks some byte tokens, as before) and by the line cache."""
    name, change, cut = ADMITTED[shape]
    plain = json.loads((real_tokenizer(name) / "tokenizer.json").read_text())
    spec = dict(plain)  # each change sets a top-level key, mutating nothing of the plain form
    change(spec)
    assert spec != plain
    assert fastokens_encoder.structure(spec) is None
    assert tiktoken_encoder.structure(spec)[0] == tiktoken_encoder.structure(plain)[0]
    assert line_cut(spec)[0] is cut


@pytest.mark.parametrize("name", ["smollm2", "qwen3"])
def test_the_shapes_take_the_fast_path_with_the_hf_bytes(real_tokenizer, tmp_path, name):
    """Every admitted shape of one real tokenizer at once (a proof and two builds each: 8-16 CPU s):
    a first build proves fastokens for it (the probe decides) and its shards are the HF tokenizer's."""
    shapes = [change for real, change, _ in ADMITTED.values() if real == name]
    directory = rewritten(real_tokenizer, tmp_path, name, lambda spec: [change(spec) for change in shapes])
    assert len(shapes) == 2 and fastokens_encoder.structure(json.loads((directory / "tokenizer.json").read_text())) is None
    data = write_jsonl(tmp_path / "hostile.jsonl", hostile_rows(300))
    settings = {"sources": [{"name": str(data)}], "pack.val_fraction": 0.1, "build.line_cache": False}
    lines: list[str] = []
    on = build(expert_config(tmp_path, "sql", directory, settings), tmp_path / "on", log=lines.append, progress=False)
    assert "fast encoder: proven exact (fastokens: the HF tokenizer's ids on the probe text)" in lines, lines
    exact = Manifest.load(on.path, full=True).outputs["exactness"]
    # (Qwen's NFC leaves the many hostile rows NFC would change to the HF tokenizer: 33 of the 300 are fastokens')
    assert exact["encoders"] == ["fastokens"] and exact["by_shortcut"] == exact["checked"] > 20, exact
    off = build(expert_config(tmp_path, "sql", directory, {**settings, "build.fast_encoder": False}), tmp_path / "off",
                log=lambda *_: None, progress=False)
    assert Manifest.load(off.path, full=True).outputs["exactness"]["by_shortcut"] == 0
    assert shards(on) == shards(off)


SEQUENCE_REFUSED = "the normalizer Sequence is neither none nor NFC"


@pytest.mark.parametrize("normalizers", [
    [{"type": "Lowercase"}],
    [{"type": "NFC"}, {"type": "NFKC"}],
    [{"type": "Sequence", "normalizers": [{"type": "NFC"}]},
     {"type": "Replace", "pattern": {"String": "\u00a0"}, "content": " "}],
], ids=["Lowercase", "NFC then NFKC", "nested NFC then Replace"])
def test_a_sequence_holding_a_real_normalizer_stays_refused_with_the_same_reason(real_tokenizer, tmp_path, normalizers):
    spec = json.loads((real_tokenizer("qwen3") / "tokenizer.json").read_text())
    spec["normalizer"] = {"type": "Sequence", "normalizers": normalizers}
    told: list = []
    assert choose(json.dumps(spec), ("fastokens", "tiktoken"), told.append) == (
        None, f"fastokens: {SEQUENCE_REFUSED}; tiktoken: {SEQUENCE_REFUSED}")
    assert told == [(None, f"fastokens: {SEQUENCE_REFUSED}; tiktoken: {SEQUENCE_REFUSED}")]
    assert line_cut(spec) == (None, "normalizer Sequence is not NFC")


def test_a_pre_tokenizer_sequence_is_judged_step_by_step(real_tokenizer):
    """Flattened, a nested step that adds or removes text is still found; tiktoken and the line cache
    still take only the two shapes they know, whatever the nesting."""
    spec = json.loads((real_tokenizer("qwen3") / "tokenizer.json").read_text())
    split, level = spec["pre_tokenizer"]["pretokenizers"]
    removed = {"type": "Split", "pattern": {"String": "~"}, "behavior": "Removed", "invert": False}
    spec["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        split, {"type": "Sequence", "pretokenizers": [removed, level]}]}
    assert fastokens_encoder.structure(spec) == "the pre-tokenizer step Split adds or removes text"
    spec["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        split, {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True}, level]}]}
    assert fastokens_encoder.structure(spec) is None  # every step keeps every character
    assert tiktoken_encoder.structure(spec)[0] == "the pre-tokenizer is not a byte-level one with a known split regex"
    assert line_cut(spec) == (None, "pre-tokenizer is not one whose line starts are known boundaries")


def test_fastokens_loads_the_plain_form_of_a_nested_sequence(real_tokenizer, tmp_path):
    """Written as nested Sequences, Qwen's pre-tokenizer takes fastokens' general path, which differs
    from the HF tokenizer on U+180E before "'s" (found by the probe, fastokens 0.3): a build's fastokens
    (pipeline/encode/encoders.py), like the proof's, is loaded from the plain form and gives the HF ids."""
    import fastokens

    directory = rewritten(real_tokenizer, tmp_path, "qwen3", nested)
    path = directory / "tokenizer.json"
    text = "7 \u180e\u180e\n\u180e's"
    want = hf_tokenizer(directory).encode(text, add_special_tokens=False).ids
    fast = encoders.fast_encoder((str(path), hashlib.sha256(path.read_bytes()).hexdigest()), "fastokens")
    assert fast.encode_ids([text]) == [want]
    as_written = fastokens_encoder.FastokensEncoder(fastokens.Tokenizer.from_json_str(path.read_text()),
                                                    fastokens_encoder.Layout(json.loads(path.read_text())))
    assert as_written.encode_ids([text]) != [want], "fastokens' general path now agrees: the plain form is not needed"
