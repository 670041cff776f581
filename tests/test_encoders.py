"""A process's encoders (pipeline/encode/encoders.py): loaded once per tokenizer, one tokenizer at a time."""

from __future__ import annotations

import hashlib

from build_fixtures import make_tokenizer
from packtrain.pipeline.encode import encoders


def key_of(directory) -> tuple[str, str]:
    path = directory / "tokenizer.json"
    return str(path), hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_process_holds_one_tokenizers_encoders_at_a_time(tmp_path, monkeypatch):
    for cache in ("TOKENIZER_CACHE", "LINE_CACHES", "FAST_ENCODERS"):
        monkeypatch.setattr(encoders, cache, {})
    first, second = key_of(make_tokenizer(tmp_path / "a")), key_of(make_tokenizer(tmp_path / "b"))
    hf = encoders.hf_tokenizer(first)
    fast = encoders.fast_encoder(first, "fastokens")
    assert encoders.hf_tokenizer(first) is hf and encoders.fast_encoder(first, "fastokens") is fast  # once
    encoders.hf_tokenizer(second)  # another tokenizer (here: the same content in another file)
    assert list(encoders.TOKENIZER_CACHE) == [second] and encoders.FAST_ENCODERS == {}
    encoders.fast_encoder(second, "fastokens")
    assert list(encoders.FAST_ENCODERS) == [(*second, "fastokens")]
    assert encoders.hf_tokenizer(first) is not hf and list(encoders.TOKENIZER_CACHE) == [first]
