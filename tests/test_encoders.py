"""A process's encoders (pipeline/encode/encoders.py): loaded once per tokenizer content, for at most
``KEPT`` tokenizers, the most recently used."""

from __future__ import annotations

import hashlib
import shutil

import pytest

from build_fixtures import make_tokenizer
from packtrain.pipeline.encode import encoders


def key_of(directory) -> tuple[str, str]:
    path = directory / "tokenizer.json"
    return str(path), hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def empty(monkeypatch):
    """This process's encoders, none loaded, one tokenizer kept (the build's setting)."""
    monkeypatch.setattr(encoders, "LOADED", {})
    monkeypatch.setattr(encoders, "KEPT", 1)


def test_a_process_holds_one_tokenizers_encoders_at_a_time(tmp_path, empty):
    first, second = key_of(make_tokenizer(tmp_path / "a")), key_of(make_tokenizer(tmp_path / "b", vocab_size=300))
    assert first[1] != second[1]
    hf = encoders.hf_tokenizer(first)
    fast = encoders.fast_encoder(first, "fastokens")
    assert encoders.hf_tokenizer(first) is hf and encoders.fast_encoder(first, "fastokens") is fast  # once
    encoders.hf_tokenizer(second)  # another tokenizer: the first one's encoders are dropped
    assert {sha: list(loaded) for sha, loaded in encoders.LOADED.items()} == {second[1]: ["hf"]}
    encoders.fast_encoder(second, "fastokens")
    assert {sha: list(loaded) for sha, loaded in encoders.LOADED.items()} == {second[1]: ["hf", "fastokens"]}
    assert encoders.hf_tokenizer(first) is not hf and list(encoders.LOADED) == [first[1]]


def test_the_same_content_in_another_directory_is_loaded_once(tmp_path, empty):
    first = key_of(make_tokenizer(tmp_path / "a"))
    shutil.copytree(tmp_path / "a", tmp_path / "copy")
    copy = key_of(tmp_path / "copy")
    assert copy[0] != first[0] and copy[1] == first[1]
    hf, fast = encoders.hf_tokenizer(first), encoders.fast_encoder(first, "fastokens")
    assert encoders.hf_tokenizer(copy) is hf and encoders.fast_encoder(copy, "fastokens") is fast


def test_kept_tokenizers_are_the_most_recently_used(tmp_path, empty, monkeypatch):
    monkeypatch.setattr(encoders, "KEPT", 2)
    a, b, c = (key_of(make_tokenizer(tmp_path / name, vocab_size=size)) for name, size in
               (("a", 400), ("b", 300), ("c", 350)))
    hf_a = encoders.hf_tokenizer(a)
    encoders.hf_tokenizer(b)
    assert encoders.hf_tokenizer(a) is hf_a  # a used again: b is now the least recently used
    encoders.fast_encoder(c, "fastokens")
    assert {sha: list(loaded) for sha, loaded in encoders.LOADED.items()} == {a[1]: ["hf"], c[1]: ["fastokens"]}
