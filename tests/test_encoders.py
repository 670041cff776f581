"""A process's encoders (pipeline/encode/encoders.py): loaded once per tokenizer content, for at most
``KEPT`` tokenizers, the most recently used."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

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


def test_every_encoder_is_built_from_the_one_read_whose_hash_was_checked(tmp_path, empty, monkeypatch):
    """A tokenizer.json replaced after its hash was checked (and put back before the build hashes its
    inputs again) gave the fork server encoders of the other content under this key, which the proof,
    the workers and the exactness sample all trusted: a wrong build under the right id (found
    2026-11-27: the server read the file once to check it, then three times more to load). Now each
    load reads it once, checks its sha256 and builds from those bytes, never from the path."""
    import fastokens
    import tokenizers

    key = key_of(make_tokenizer(tmp_path / "a"))
    reads = []
    real_read = Path.read_bytes

    def read_bytes(self):
        reads.append(self.name)
        return real_read(self)

    def by_path(*_, **__):
        raise AssertionError("built from the path, not from the checked bytes")

    def from_bytes_only(real):
        return type("FromBytesOnly", (), {"from_file": staticmethod(by_path), "from_str": staticmethod(real.from_str)}
                    if hasattr(real, "from_str") else
                    {"from_file": staticmethod(by_path), "from_json_str": staticmethod(real.from_json_str)})

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    monkeypatch.setattr(Path, "read_text", by_path)
    monkeypatch.setattr(tokenizers, "Tokenizer", from_bytes_only(tokenizers.Tokenizer))
    monkeypatch.setattr(fastokens, "Tokenizer", from_bytes_only(fastokens.Tokenizer))
    encoders.fast_encoder(key, "fastokens")
    encoders.hf_tokenizer(key)
    encoders.fast_encoder(key, "tiktoken")
    encoders.line_cache(key)
    assert sorted(encoders.LOADED[key[1]]) == ["fastokens", "hf", "line_cache", "tiktoken"]
    assert reads == ["tokenizer.json"] * 4  # one read per encoder built


@pytest.mark.parametrize("kind", ["hf", "fastokens", "tiktoken", "line_cache"])
def test_an_encoder_of_other_content_than_the_key_is_never_built(tmp_path, empty, kind):
    from packtrain.pipeline.errors import ContentChanged

    key = key_of(make_tokenizer(tmp_path / "a"))
    shutil.copy(make_tokenizer(tmp_path / "b", vocab_size=300) / "tokenizer.json", key[0])  # replaced since hashed
    load = {"hf": encoders.hf_tokenizer, "line_cache": encoders.line_cache}.get(
        kind, lambda k: encoders.fast_encoder(k, kind))
    with pytest.raises(ContentChanged, match="tokenizer.json changed while the build read it"):
        load(key)
    assert encoders.LOADED.get(key[1], {}) == {}
