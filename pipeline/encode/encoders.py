"""A tokenizing worker's encoders, each built once per process: the HF tokenizer (the reference), the
line cache (pipeline/encode/fast/line_cache.py) and the fast encoders, fastokens
(pipeline/encode/fast/fastokens_encoder.py) and tiktoken (pipeline/encode/fast/tiktoken_encoder.py).

A key is (tokenizer.json path, its sha256): the file is read from the path once per load, its sha256
checked against the key's, and every encoder is built from those very bytes (:func:`tokenizer_text`),
never from the path again: a file replaced between the check and a load (and put back before the
build hashes its inputs once more) would otherwise give encoders of other content under this key,
which the workers and the proof trust. The encoders are kept by the content hash alone. So a
process that builds again after the file changed (a long-lived one, or ``num_proc`` 1, where the
build's own process tokenizes) never encodes with the old content, and one that meets the same file
in another directory (two experts' copies of one base model's tokenizer) loads it once. A process
holds the encoders of :data:`KEPT` tokenizers at most, the most recently used (a build has one
tokenizer): using another's drops the oldest (:func:`_loaded`), so a long-lived process (a Ray
worker, ``packtrain rebuild`` of experts with other models at ``num_proc`` 1) does not keep every
tokenizer it ever loaded (Qwen3's: about 0.3 GiB with fastokens).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from packtrain.pipeline.encode.fast import fastokens_encoder, tiktoken_encoder
from packtrain.core.memory import release_freed
from packtrain.core.inputs import one_line, parse_json, read_input
from packtrain.pipeline.errors import TokenizerError, read_as_hashed
from packtrain.pipeline.encode.fast.line_cache import LineCache, line_cut

KEPT = 1
"""How many tokenizers' encoders a process keeps. One: a build has one tokenizer. The test processes
keep more (tests/conftest.py): they alternate between the three real tokenizers, test after test."""

LOADED: dict[str, dict[str, object]] = {}
"""tokenizer.json's sha256 -> its encoders loaded so far ("hf", "line_cache", "fastokens",
"tiktoken"), the most recently used tokenizer last."""


def _loaded(key: tuple[str, str]) -> dict[str, object]:
    """``key``'s encoders, its tokenizer now the most recently used; the encoders of the tokenizers
    beyond the :data:`KEPT` most recently used are forgotten (before one of ``key``'s is loaded)."""
    loaded = LOADED.pop(key[1], {})
    LOADED[key[1]] = loaded
    for old in list(LOADED)[:-KEPT]:
        del LOADED[old]
    return loaded


def tokenizer_text(key: tuple[str, str]) -> str:
    """tokenizer.json's content at ``key[0]``, read once, where its sha256 is ``key[1]`` (else
    :class:`ContentChanged`): what every encoder of ``key`` is built from."""
    path = Path(key[0])
    raw = read_as_hashed(path, key[1], "build again", "a tokenizers file")
    return read_input(path, lambda _: raw.decode("utf-8"), "build again", "a tokenizers file")


def _spec(text: str, key: tuple[str, str]) -> dict:
    """tokenizer.json's parse, from its checked content."""
    return read_input(Path(key[0]), lambda _: parse_json(text), "build again", "a tokenizers file")


def hf_tokenizer(key: tuple[str, str], text: str | None = None):
    """The worker's HF tokenizer of ``key`` (tokenizer.json path, sha256), loaded once per process from
    the content :func:`tokenizer_text` checked (``text``: that content, where the caller read it)."""
    loaded = _loaded(key)
    if "hf" not in loaded:
        from tokenizers import Tokenizer

        loaded["hf"] = Tokenizer.from_str(tokenizer_text(key) if text is None else text)
        release_freed()  # the file's parse, freed: a worker holds each tokenizer for the whole build
    return loaded["hf"]


def line_cache(key: tuple[str, str]) -> LineCache:
    """The worker's line cache, cut where this tokenizer allows (the build checked it has a cut)."""
    loaded = _loaded(key)
    if "line_cache" not in loaded:
        cut, why = line_cut(_spec(tokenizer_text(key), key))
        if cut is None:
            raise TokenizerError(f"{key[0]}: the line cache cannot cut this tokenizer's texts ({why})")
        hf = hf_tokenizer(key)
        loaded["line_cache"] = LineCache(lambda texts: [e.ids for e in hf.encode_batch(texts, add_special_tokens=False)],
                                         cut)
    return loaded["line_cache"]


class NotExact(Exception):
    """The fast encoder's structural checks refuse this tokenizer (a remembered decision said otherwise)."""


def fast_encoder(key: tuple[str, str], name: str, meanwhile: Callable[[str], object] | None = None,
                 text: str | None = None):
    """The worker's fast encoder ``name`` (fastokens or tiktoken), built once per process (the build
    decided it is exact): ``encode_documents(docs)`` gives each document's ids and supervised token
    ranges, or None where the HF tokenizer must make it. Its structural checks run again here, so a
    decision remembered in the cache cannot apply it where they refuse it (:class:`NotExact`).

    ``meanwhile(text)``: called with the checked content while fastokens' tokenizer loads
    (:func:`_fastokens`), once the checks passed; the fork server loads the HF tokenizer there
    (pipeline/encode/fork_server.py). ``text``: the content :func:`tokenizer_text` checked, where the
    caller read it."""
    loaded = _loaded(key)
    if name not in loaded:
        if name == fastokens_encoder.NAME:
            loaded[name] = _fastokens(key, meanwhile, tokenizer_text(key) if text is None else text)
        elif name == tiktoken_encoder.NAME:
            spec = _spec(tokenizer_text(key) if text is None else text, key)
            problem, ranks, _ = tiktoken_encoder.structure(spec)
            if problem is not None:
                raise NotExact(f"its structural checks refuse this tokenizer ({problem})")
            loaded[name] = tiktoken_encoder.FastEncoder(spec, lambda: hf_tokenizer(key), ranks)
            del spec
        else:
            raise ValueError(f"no fast encoder named {name!r}")
        release_freed()  # the parsed tokenizer.json and the load's scratch, freed (about 90 MiB for Qwen's vocabulary)
    return loaded[name]


def _fastokens(key: tuple[str, str], meanwhile: Callable[[str], object] | None, text: str):
    """fastokens' encoder of ``key``. Its tokenizer loads in a thread from the start (a native load
    that releases the GIL: about 1 s of Qwen3's 1.5) while tokenizer.json is parsed and checked here
    and ``meanwhile(text)`` runs (the HF tokenizer's load holds the GIL), all from ``text``, the one
    content :func:`tokenizer_text` checked (where its normalizer or pre-tokenizer is not written in
    its plain form, fastokens loads that again from the plain form: fastokens_encoder.loaded_text);
    the thread has ended on return, also on a refusal (:class:`NotExact`, the load then dropped)."""
    import fastokens

    with ThreadPoolExecutor(1, thread_name_prefix="packtrain-fastokens") as pool:
        native = pool.submit(fastokens.Tokenizer.from_json_str, text)
        spec = _spec(text, key)
        problem, lengths = fastokens_encoder.checked(spec)
        if problem is not None:
            raise NotExact(f"its structural checks refuse this tokenizer ({problem})")
        native_text = fastokens_encoder.loaded_text(text, spec)
        if native_text is not text:  # a Sequence not written in its plain form: fastokens loads the plain one
            native.exception()  # waited for, and dropped
            native = pool.submit(fastokens.Tokenizer.from_json_str, native_text)
        layout = fastokens_encoder.Layout(spec, lengths)
        del spec
        release_freed()  # the parse, freed before the load's scratch peaks (fastokens_encoder.Layout)
        if meanwhile is not None:
            meanwhile(text)
        try:
            loaded = native.result()
        except Exception as e:  # noqa: BLE001 - its Rust loader's errors (a vocabulary with gaps in its ids): not exact here
            raise NotExact(f"fastokens cannot load this tokenizer ({one_line(e)})") from None
        return fastokens_encoder.FastokensEncoder(loaded, layout)
