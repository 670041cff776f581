"""A tokenizing worker's encoders, each built once per process: the HF tokenizer (the reference), the
line cache (pipeline/encode/line_cache.py) and the fast encoders, fastokens
(pipeline/encode/fastokens_encoder.py) and tiktoken (pipeline/encode/tiktoken_encoder.py).

A key is (tokenizer.json path, its sha256): the file is read from the path, and the encoders are
kept by the content hash alone. So a process that builds again after the file changed (a long-lived
one, or ``num_proc`` 1, where the build's own process tokenizes) never encodes with the old content,
and one that meets the same file in another directory (two experts' copies of one base model's
tokenizer) loads it once. A process holds the encoders of :data:`KEPT` tokenizers at most, the most
recently used (a build has one tokenizer): using another's drops the oldest (:func:`_use`),
so a long-lived process (a Ray worker, ``packtrain rebuild`` of experts with other models at
``num_proc`` 1) does not keep every tokenizer it ever loaded (Qwen3's: about 0.3 GiB with fastokens).
"""

from __future__ import annotations

from pathlib import Path

from packtrain.core.inputs import read_json
from packtrain.pipeline.encode import fastokens_encoder, tiktoken_encoder
from packtrain.pipeline.encode.memory import release_freed
from packtrain.pipeline.errors import TokenizerError
from packtrain.pipeline.encode.line_cache import LineCache, line_cut

KEPT = 1
"""How many tokenizers' encoders a process keeps. One: a build has one tokenizer. The test processes
keep more (tests/conftest.py): they alternate between the three real tokenizers, test after test."""

TOKENIZER_CACHE: dict[str, object] = {}  # sha256 -> the HF tokenizer
LINE_CACHES: dict[str, LineCache] = {}  # sha256 -> the line cache
FAST_ENCODERS: dict[tuple[str, str], object] = {}  # (sha256, encoder name) -> the fast encoder
USED: list[str] = []  # the sha256 of every tokenizer whose encoders are kept, the most recently used last


def _use(key: tuple[str, str]) -> None:
    """Mark ``key``'s tokenizer as the most recently used, and forget the encoders of the tokenizers
    beyond the :data:`KEPT` most recently used (before one of ``key``'s is loaded)."""
    if key[1] in USED:
        USED.remove(key[1])
    USED.append(key[1])
    for old in USED[:-KEPT]:
        USED.remove(old)
        for cache in (TOKENIZER_CACHE, LINE_CACHES, FAST_ENCODERS):
            for k in [k for k in cache if (k[0] if isinstance(k, tuple) else k) == old]:
                del cache[k]


def hf_tokenizer(key: tuple[str, str]):
    """The worker's HF tokenizer of ``key`` (tokenizer.json path, sha256), loaded once per process."""
    _use(key)
    tokenizer = TOKENIZER_CACHE.get(key[1])
    if tokenizer is None:
        from tokenizers import Tokenizer

        tokenizer = TOKENIZER_CACHE[key[1]] = Tokenizer.from_file(key[0])
        release_freed()  # the file's parse, freed: a worker holds each tokenizer for the whole build
    return tokenizer


def line_cache(key: tuple[str, str]) -> LineCache:
    """The worker's line cache, cut where this tokenizer allows (the build checked it has a cut)."""
    _use(key)
    cache = LINE_CACHES.get(key[1])
    if cache is None:
        cut, why = line_cut(read_json(Path(key[0]), "build again", "a tokenizers file"))
        if cut is None:
            raise TokenizerError(f"{key[0]}: the line cache cannot cut this tokenizer's texts ({why})")
        hf = hf_tokenizer(key)
        cache = LINE_CACHES[key[1]] = LineCache(
            lambda texts: [e.ids for e in hf.encode_batch(texts, add_special_tokens=False)], cut)
    return cache


class NotExact(Exception):
    """The fast encoder's structural checks refuse this tokenizer (a remembered decision said otherwise)."""


def fast_encoder(key: tuple[str, str], name: str):
    """The worker's fast encoder ``name`` (fastokens or tiktoken), built once per process (the build
    decided it is exact): ``encode_documents(docs)`` gives each document's ids and supervised token
    ranges, or None where the HF tokenizer must make it. Its structural checks run again here, so a
    decision remembered in the cache cannot apply it where they refuse it (:class:`NotExact`)."""
    _use(key)
    encoder = FAST_ENCODERS.get((key[1], name))
    if encoder is None:
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
        FAST_ENCODERS[(key[1], name)] = encoder
        del spec
        release_freed()  # the parsed tokenizer.json, freed (about 90 MiB for Qwen's vocabulary)
    return encoder
