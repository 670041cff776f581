"""A tokenizing worker's encoders, each built once per process: the HF tokenizer (the reference), the
line cache (pipeline/encode/line_cache.py) and the fast encoders, fastokens
(pipeline/encode/fastokens_encoder.py) and tiktoken (pipeline/encode/tiktoken_encoder.py).

They are keyed by (tokenizer.json path, its sha256), so a process that builds again after the file
changed (a long-lived one, or ``num_proc`` 1, where the build's own process tokenizes) never encodes
with the old content. A process holds one tokenizer's encoders at a time (a build has one
tokenizer): loading another's drops the others (:func:`_drop_others`), so a long-lived process (a
Ray worker, ``packtrain rebuild`` of experts with other models at ``num_proc`` 1) does not keep every
tokenizer it ever loaded (Qwen3's: about 0.3 GiB with fastokens).
"""

from __future__ import annotations

from pathlib import Path

from packtrain.core.inputs import read_json
from packtrain.pipeline.encode import fastokens_encoder, tiktoken_encoder
from packtrain.pipeline.encode.memory import release_freed
from packtrain.pipeline.errors import TokenizerError
from packtrain.pipeline.encode.line_cache import LineCache, line_cut

TOKENIZER_CACHE: dict[tuple[str, str], object] = {}
LINE_CACHES: dict[tuple[str, str], LineCache] = {}
FAST_ENCODERS: dict[tuple[str, str, str], object] = {}


def _drop_others(key: tuple[str, str]) -> None:
    """Forget the encoders of every tokenizer but ``key``'s (before loading one of ``key``'s)."""
    for cache in (TOKENIZER_CACHE, LINE_CACHES, FAST_ENCODERS):
        for other in [k for k in cache if k[:2] != key]:
            del cache[other]


def hf_tokenizer(key: tuple[str, str]):
    """The worker's HF tokenizer of ``key`` (tokenizer.json path, sha256), loaded once per process."""
    tokenizer = TOKENIZER_CACHE.get(key)
    if tokenizer is None:
        from tokenizers import Tokenizer

        _drop_others(key)
        tokenizer = TOKENIZER_CACHE[key] = Tokenizer.from_file(key[0])
        release_freed()  # the file's parse, freed: a worker holds each tokenizer for the whole build
    return tokenizer


def line_cache(key: tuple[str, str]) -> LineCache:
    """The worker's line cache, cut where this tokenizer allows (the build checked it has a cut)."""
    cache = LINE_CACHES.get(key)
    if cache is None:
        _drop_others(key)
        cut, why = line_cut(read_json(Path(key[0]), "build again", "a tokenizers file"))
        if cut is None:
            raise TokenizerError(f"{key[0]}: the line cache cannot cut this tokenizer's texts ({why})")
        hf = hf_tokenizer(key)
        cache = LINE_CACHES[key] = LineCache(
            lambda texts: [e.ids for e in hf.encode_batch(texts, add_special_tokens=False)], cut)
    return cache


class NotExact(Exception):
    """The fast encoder's structural checks refuse this tokenizer (a remembered decision said otherwise)."""


def fast_encoder(key: tuple[str, str], name: str):
    """The worker's fast encoder ``name`` (fastokens or tiktoken), built once per process (the build
    decided it is exact): ``encode_documents(docs)`` gives each document's ids and supervised token
    ranges, or None where the HF tokenizer must make it. Its structural checks run again here, so a
    decision remembered in the cache cannot apply it where they refuse it (:class:`NotExact`)."""
    encoder = FAST_ENCODERS.get((*key, name))
    if encoder is None:
        _drop_others(key)
        spec = read_json(Path(key[0]), "build again", "a tokenizers file")
        if name == fastokens_encoder.NAME:
            import fastokens

            problem, lengths = fastokens_encoder.checked(spec)
            if problem is None:
                encoder = fastokens_encoder.FastokensEncoder(fastokens.Tokenizer.from_file(key[0]), spec, lengths)
        elif name == tiktoken_encoder.NAME:
            problem, ranks, _ = tiktoken_encoder.structure(spec)
            if problem is None:
                encoder = tiktoken_encoder.FastEncoder(spec, lambda: hf_tokenizer(key), ranks)
        else:
            raise ValueError(f"no fast encoder named {name!r}")
        if problem is not None:
            raise NotExact(f"its structural checks refuse this tokenizer ({problem})")
        FAST_ENCODERS[(*key, name)] = encoder
        del spec
        release_freed()  # the parsed tokenizer.json, freed (about 90 MiB for Qwen's vocabulary)
    return encoder
