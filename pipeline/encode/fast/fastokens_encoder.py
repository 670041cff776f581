"""fastokens: a Rust reimplementation of the HF ``tokenizers`` pipeline that reads the same
``tokenizer.json`` and encodes a batch into one flat uint32 buffer (tens of millions of tokens per
CPU-second on Qwen3's vocabulary, where ``tokenizers`` 0.23 makes 0.65M: docs/BENCHMARKS.md).

It is a shortcut like every encoder that is not the reference, so it is used only where

- :func:`structure` finds nothing it cannot reproduce or place: a BPE model without dropout, byte
  fallback, subword prefix or word suffix, over the byte-level alphabet (each token then stands for
  a fixed run of bytes, which places the supervised spans without character offsets, which fastokens
  does not give: pipeline/encode/fast/byte_spans.py), behind a byte-level pre-tokenizer whose steps
  neither add nor remove text (no prefix space, no "Removed" split), with no normalizer or NFC (a
  text NFC would change is left to the HF tokenizer; a Sequence is judged by its steps:
  pipeline/encode/tokenizer_shape.py), no added token that strips the whitespace
  beside it, and no post-processor that trims offsets;
- :func:`decide` found its ids identical to the HF tokenizer's on the probe text
  (pipeline/encode/fast/probe.py), in the decision process beside the build (pipeline/encode/fast/encoder_decision.py);
- and the build's own exactness check (pipeline/encode/fast/exactness.py) finds every document it
  re-encodes with the HF tokenizer identical; one that differs drops fastokens for this tokenizer.
"""

from __future__ import annotations

import json

import numpy as np

from packtrain.pipeline.encode.assemble import FlatDocuments
from packtrain.pipeline.encode.fast.byte_level import single_bytes, token_byte_lengths, trims_offsets
from packtrain.pipeline.encode.fast.byte_spans import SpanPlacer
from packtrain.core.memory import release_freed
from packtrain.core.inputs import one_line
from packtrain.pipeline.encode.fast.probe import probe_difference, probe_pieces
from packtrain.pipeline.encode.tokenizer_shape import normalizer_form, normalizer_name, plain_form, pre_tokenizer_steps

NAME = "fastokens"
KEEPS_EVERY_CHARACTER = {"ByteLevel", "Split", "Digits", "Punctuation"}  # pre-tokenizer steps (not "Removed")


def structure(spec: dict) -> str | None:
    """Why fastokens' output cannot be used for this ``tokenizer.json`` (one line), or None."""
    return checked(spec)[0]


def checked(spec: dict) -> tuple[str | None, np.ndarray | None]:
    """:func:`structure`'s answer and, where it is None, the token byte lengths it computed on the way
    (:class:`FastokensEncoder` takes them: 0.1-0.4 CPU s on Qwen3's vocabulary, not computed twice)."""
    problem = _problem(spec)
    if problem is not None:
        return problem, None
    lengths = token_byte_lengths(spec)
    if lengths is None:
        return "a vocabulary token is not in the byte-level alphabet", None
    return None, lengths


def _problem(spec: dict) -> str | None:
    """:func:`structure` but for the vocabulary's alphabet."""
    try:
        import fastokens  # noqa: F401
    except ImportError:
        return "not installed (pip install fastokens)"
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        return f"the model is {model.get('type')}, not BPE"
    if model.get("dropout") or model.get("byte_fallback") or model.get("continuing_subword_prefix") \
            or model.get("end_of_word_suffix"):
        return "the BPE model uses dropout, byte fallback, a subword prefix or a word suffix"
    if normalizer_form(spec) is None:
        return f"the normalizer {normalizer_name(spec)} is neither none nor NFC"
    steps = pre_tokenizer_steps(spec)  # a Sequence judged step by step, nested ones flattened
    if not any(step.get("type") == "ByteLevel" for step in steps):
        return "the pre-tokenizer is not byte-level"
    # every character of the text must land in exactly the bytes of its tokens: no step that adds
    # (a prefix space) or removes text, no added token that takes in the whitespace beside it, and no
    # offsets trimmed (each would move a span edge the token byte lengths cannot see)
    for step in steps:
        if step.get("type") not in KEEPS_EVERY_CHARACTER or step.get("behavior") == "Removed" \
                or step.get("add_prefix_space"):
            return f"the pre-tokenizer step {step.get('type')} adds or removes text"
    for token in spec.get("added_tokens") or []:
        if token.get("lstrip") or token.get("rstrip") or token.get("single_word") or not token.get("content"):
            return f"the added token {token.get('content')!r} strips, is single-word or is empty"
    if trims_offsets(spec):
        return "the post-processor trims offsets"
    return None


def decide(text: str, on_checks=None, spec: dict | None = None, loaded: dict | None = None) -> tuple[bool, str]:
    """Whether fastokens gives this tokenizer's ids (``text``: tokenizer.json's content; ``spec``: it
    parsed, where the caller has it), and why. ``on_checks(problem)`` is called once :func:`structure`
    has answered, before the probe. ``loaded``: fastokens' encoder and the HF tokenizer already
    loaded from ``text`` (by kind, as pipeline/encode/encoders.py keeps them: the build's fork
    server's), used instead of loading them here."""
    loaded = loaded or {}
    if NAME in loaded:  # made only where these checks passed on this very content (encoders._fastokens):
        problem, lengths = None, None  # no second parse (~60 MiB and 0.2 CPU s on Qwen3's, beside the workers)
    else:
        spec = json.loads(text) if spec is None else spec
        problem, lengths = checked(spec)
    if on_checks is not None:
        on_checks(problem)
    if problem is not None:
        return False, problem
    from tokenizers import Tokenizer

    import fastokens

    # one tokenizer at a time, each freed before the next loads (the decision process's memory beside
    # the workers': docs/BENCHMARKS.md): fastokens' ids first, then the HF tokenizer's
    layout = None if NAME in loaded else Layout(spec, lengths)
    native_text = None if NAME in loaded else loaded_text(text, spec)
    spec = None
    release_freed()  # the parse, freed before fastokens loads (memory: the decision runs beside the workers)
    try:
        encoder = loaded[NAME] if layout is None else FastokensEncoder(
            loaded_tokenizer(lambda: fastokens.Tokenizer.from_json_str(native_text)), layout)
    except NotLoaded as e:
        return False, str(e)
    native_text = None
    release_freed()  # the load's scratch, before the probe is encoded
    nfc = encoder.placer.nfc
    encodable, ids, offsets = encoder.encode_encodable(probe_pieces(nfc))  # one uint32 buffer, not lists (memory)
    where = {k: (a, b) for k, a, b in zip(encodable, offsets[:-1].tolist(), offsets[1:].tolist())}
    del encoder
    release_freed()
    hf = loaded.get("hf") or Tokenizer.from_str(text)
    release_freed()  # the HF tokenizer's load scratch

    def fast(k: int, piece: str) -> list[int]:
        if k not in where:  # a piece fastokens cannot encode is the HF tokenizer's in a build too
            return hf.encode(piece, add_special_tokens=False).ids
        return ids[where[k][0] : where[k][1]].tolist()

    problem = probe_difference(fast, hf, nfc)
    if problem is not None:
        return False, f"fastokens: {problem}"
    return True, "the HF tokenizer's ids on the probe text"


class NotLoaded(Exception):
    """fastokens' own loader refused a tokenizer the structural checks admit (a vocabulary with holes, ids past
    the count of its tokens: ``model error: unsupported model type``)."""


def loaded_tokenizer(load):
    """``load()``'s fastokens tokenizer; its loader's refusal (a ValueError from its native code, which ended
    the decision's child: a failed decision, not remembered, proved again by every build) a :class:`NotLoaded`
    that says it, as a worker's load says it (pipeline/encode/encoders.py ``_fastokens``)."""
    try:
        return load()
    except Exception as e:  # noqa: BLE001 - its Rust loader's errors: as encoders._fastokens says them
        raise NotLoaded(f"fastokens cannot load this tokenizer ({one_line(e)})") from None


def loaded_text(text: str, spec: dict) -> str:
    """What fastokens loads for tokenizer.json ``text`` (``spec``: it parsed): the text itself, or where
    its normalizer or pre-tokenizer is not written in the plain form, the plain form
    (pipeline/encode/tokenizer_shape.py ``plain_form``: the same tokenizer, on fastokens' own path)."""
    plain = plain_form(spec)
    return text if plain is None else json.dumps(plain)


class Layout:
    """What :class:`FastokensEncoder` needs of a parsed tokenizer.json besides fastokens itself. Taken
    before fastokens loads, so the parse (about 60 MiB for Qwen's vocabulary) is freed first instead
    of held beside the load's own ~90 MiB of scratch."""

    def __init__(self, spec: dict, lengths: np.ndarray | None = None):
        """``lengths``: ``token_byte_lengths(spec)``, where the caller has them (:func:`checked`)."""
        # the bytes the vocabulary has a token for: fastokens fails on a text with any other (SmolLM2's
        # vocabulary lacks some, e.g. 0xF1, a lead byte of U+40000..U+7FFFF), which the HF tokenizer encodes
        have = single_bytes(spec)
        self.present = None if len(have) == 256 else have  # None: every byte has a token
        self.ascii = all(b in have for b in range(128))  # every ASCII text is encodable
        lengths = token_byte_lengths(spec) if lengths is None else lengths
        self.placer = SpanPlacer(lengths, nfc=normalizer_form(spec) == "NFC", trims=trims_offsets(spec))


class FastokensEncoder:
    """fastokens for the documents whose spans it can place (the HF tokenizer makes the rest). Build
    it only where :func:`decide` said yes. ``tokenizer``: the ``fastokens.Tokenizer`` of a
    tokenizer.json, ``layout``: the :class:`Layout` of its parse."""

    name = NAME

    def __init__(self, tokenizer, layout: Layout):
        self.tokenizer = tokenizer
        self.present, self.ascii, self.placer = layout.present, layout.ascii, layout.placer

    def encode_flat(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Every text's ids concatenated (uint32) and where each starts (``len(texts) + 1`` offsets)."""
        ids, offsets = self.tokenizer.encode_batch_flat(texts, add_special_tokens=False)
        return np.frombuffer(ids, np.uint32), np.frombuffer(offsets, np.uint64).astype(np.int64)

    def encodable(self, text: str) -> bool:
        """Whether fastokens can encode ``text``: every byte of it has a token."""
        return self.present is None or (self.ascii and text.isascii()) or \
            not text.encode("utf-8", "surrogatepass").translate(None, self.present)

    def encode_encodable(self, texts: list[str]) -> tuple[list[int], np.ndarray, np.ndarray]:
        """Which of the texts it can encode (their indices), and those texts' ids as :meth:`encode_flat` gives them."""
        todo = [k for k, text in enumerate(texts) if self.encodable(text)]
        return (todo, *self.encode_flat([texts[k] for k in todo]))

    def encode_ids(self, texts: list[str], hf=None) -> list[list[int] | None]:
        """Each text's ids; None for a text it cannot encode (or the HF tokenizer ``hf``'s ids, given one)."""
        todo, ids, offsets = self.encode_encodable(texts)
        out: list = [None] * len(texts)
        for k, a, b in zip(todo, offsets[:-1], offsets[1:]):
            out[k] = ids[a:b].tolist()
        rest = [k for k, got in enumerate(out) if got is None]
        for k, encoding in zip(rest, hf.encode_batch_fast([texts[k] for k in rest], add_special_tokens=False)
                               if hf is not None and rest else []):
            out[k] = encoding.ids
        return out

    def encode_documents(self, docs) -> list:
        """Per document (a ``Formatted``: text and supervised character spans), its ids as a uint32
        array and its spans as token ranges, or None where the HF tokenizer must make it."""
        out: list = [None] * len(docs)
        todo = [k for k, doc in enumerate(docs)
                if self.placer.placeable(doc.text, doc.spans) and self.encodable(doc.text)]
        if not todo:
            return out
        texts = [docs[k].text for k in todo]
        ids, offsets = self.encode_flat(texts)
        placed = self.placer.place(texts, [docs[k].spans for k in todo], ids.astype(np.int64), np.diff(offsets))
        bounds = offsets.tolist()
        for j, (k, spans) in enumerate(zip(todo, placed)):
            if spans is not None:
                out[k] = (ids[bounds[j]:bounds[j + 1]], spans)
        return out

    def encode_documents_flat(self, docs) -> FlatDocuments | None:
        """:meth:`encode_documents` as arrays (pipeline/encode/assemble.py ``FlatDocuments``: no Python
        object per document), where every document has a span, can be placed and encoded; None otherwise
        (the caller takes :meth:`encode_documents`). A document whose span starts inside a token is marked
        (``inside``), as :meth:`encode_documents` leaves it to the HF tokenizer."""
        if not all(doc.spans and self.placer.placeable(doc.text, doc.spans) and self.encodable(doc.text) for doc in docs):
            return None
        texts, spans = [doc.text for doc in docs], [doc.spans for doc in docs]
        ids, offsets = self.encode_flat(texts)
        edges, inside = self.placer.place_flat(texts, spans, ids.astype(np.int64), np.diff(offsets))
        return FlatDocuments(ids, offsets, np.fromiter(map(len, spans), np.int64, len(spans)), edges, inside)

    def encode_suffixes(self, texts: list[str], prompt_chars: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Prompt + answer documents, given column-wise (pipeline/format/format_columns.py): one supervised
        span each, from ``prompt_chars`` to the end of the text. Every text's ids concatenated (uint32;
        none for a text left to the HF tokenizer), where each starts (``len(texts) + 1`` offsets), and
        each document's first supervised token, -1 where the HF tokenizer must make it (as
        :meth:`encode_documents` leaves it: a text it cannot encode, or whose span it cannot place)."""
        firsts = np.full(len(texts), -1, np.int64)
        keep = self.placer.suffixes_placeable(texts, prompt_chars)
        if self.present is not None:
            keep &= np.fromiter(map(self.encodable, texts), bool, len(texts))
        todo = np.flatnonzero(keep)
        if len(todo) < len(texts):
            texts, prompt_chars = [texts[k] for k in todo], prompt_chars[todo]
        ids, offsets = self.encode_flat(texts)
        prompt_bytes = np.fromiter((start if text.isascii() else len(text[:start].encode("utf-8"))
                                    for text, start in zip(texts, prompt_chars.tolist())), np.int64, len(texts))
        placed = self.placer.place_suffixes(ids.astype(np.int64), np.diff(offsets), prompt_bytes)
        if len(todo) == len(firsts):
            return ids, offsets, placed
        firsts[todo] = placed
        counts = np.zeros(len(firsts), np.int64)
        counts[todo] = np.diff(offsets)
        return ids, np.concatenate([[0], np.cumsum(counts)]), firsts
