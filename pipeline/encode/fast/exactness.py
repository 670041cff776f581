"""Exactness by check: every document a shortcut made is admitted only if the reference agrees.

A shortcut is anything that can change a document's ids or mask: the fast encoders (fastokens,
pipeline/encode/fast/fastokens_encoder.py; tiktoken, pipeline/encode/fast/tiktoken_encoder.py) and the line cache (pipeline/encode/fast/line_cache.py). The reference is the model's
own ``tokenizers.Tokenizer`` encoding the whole text (``encode(text, add_special_tokens=False)``),
with the supervised spans placed by its character offsets (pipeline/encode/worker.py ``token_spans``).

Which documents are checked (in the worker that made them, before anything is cached):

- every document a shortcut made in the first ``build.check_documents`` rows of each source
  (so a small build is checked whole);
- and one in :data:`SAMPLE_ONE_IN` of the rest, chosen by the low bits of the hash of the document's
  text that also chooses its split (pipeline/encode/splits.py ``is_validation`` compares the whole
  64-bit value with the fraction: the split follows the high bits, the sample the low nine, so val
  documents are sampled as often as train ones; one hash per text, not two), the same documents on
  every machine and every run, whatever ``num_proc``.

A difference in ids or mask never reaches a shard: the build stops tokenizing, drops that
shortcut for this tokenizer (remembered in the cache directory: ``.fast-encoder/`` for the fast encoders,
``.line-cache/`` for the line cache, keyed by the tokenizer's content and the libraries' versions),
says so in one line, and tokenizes every source again without it. The manifest records how many
documents were checked (``outputs.exactness``).

What can change the bytes is part of the build's identity (:func:`encoder_identity`): the
``tokenizers`` version, the fastokens and tiktoken versions when a fast encoder is allowed, and the shortcuts
allowed. It is in the build id, in every source-cache key, and in the manifest.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np

from packtrain.pipeline.format import chat_once
from packtrain.pipeline.encode.fast.line_cache import CUT_VERSION
from packtrain.pipeline.encode.notes import note_file, read_note, write_note

SAMPLE_ONE_IN = 512
LINE_CACHE_NOTES = ".line-cache"  # in the cache directory: remembered line-cache refusals, one file per tokenizer
RENDER_ONCE_NOTES = ".render-once"  # and the one-render shortcut's, one file per chat template
LINE_CACHE = "line cache"
RENDER_ONCE = "chat render once"


def fast_encoder_label(name: str) -> str:
    """How the log names a fast encoder's documents: ``fast encoder (fastokens)``."""
    return f"fast encoder ({name})"


def library_version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


FAST_ENCODERS = ("fastokens", "tiktoken")  # the fast encoders, in the order ``build.fast_encoder: true`` tries them


def fast_encoder_candidates(setting: bool | str) -> tuple[str, ...]:
    """The fast encoders ``build.fast_encoder`` allows, in the order they are tried.

    >>> fast_encoder_candidates(True), fast_encoder_candidates("tiktoken"), fast_encoder_candidates(False)
    (('fastokens', 'tiktoken'), ('tiktoken',), ())
    """
    return FAST_ENCODERS if setting is True else () if setting is False else (setting,)


def encoder_identity(build, fmt) -> dict:
    """What, besides the tokenizer's files, decides a build's ids (``build``, ``fmt``: the config's
    build and format sections): the libraries that encode (the fast encoders' only where
    ``build.fast_encoder`` allows them; jinja2, which renders chat templates, in chat style) and the
    shortcuts the config allows (``build.fast_encoder``, ``build.line_cache``, ``build.render_once``
    for conversations)."""
    once = build.render_once and fmt.messages is not None
    return {
        "tokenizers": library_version("tokenizers"),
        **{name: library_version(name) if name in fast_encoder_candidates(build.fast_encoder) else None
           for name in FAST_ENCODERS},
        "jinja2": library_version("jinja2") if fmt.style == "chat" else None,
        "shortcuts": [name for name, on in (("fast_encoder", build.fast_encoder is not False),
                                            ("line_cache", build.line_cache), ("render_once", once)) if on],
    }


def describe_identity(identity: dict) -> str:
    """``tokenizers 0.23.3 + fastokens 0.3.5 + tiktoken 0.14.0 (shortcuts: fast_encoder, line_cache)``"""
    libraries = " + ".join(f"{name} {identity[name]}" for name in ("tokenizers", "fastokens", "tiktoken", "jinja2")
                           if identity.get(name))
    return f"{libraries} (shortcuts: {', '.join(identity['shortcuts']) or 'none'})"


def sampled(text: str) -> bool:
    """Whether a document beyond the first ``build.check_documents`` rows is checked: one in
    :data:`SAMPLE_ONE_IN`, by the low bits of the 64-bit blake2b of its text (the split's hash)."""
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % SAMPLE_ONE_IN == 0


def sampled_mask(digests: np.ndarray) -> np.ndarray:
    """:func:`sampled` of many texts at once, given their hashes (pipeline/encode/splits.py ``text_digests``).

    >>> texts = [f"row {i}" for i in range(2000)]
    >>> digests = np.array([int.from_bytes(hashlib.blake2b(t.encode(), digest_size=8).digest(), "big") for t in texts],
    ...                    np.uint64)
    >>> sampled_mask(digests).tolist() == [sampled(t) for t in texts]
    True
    """
    return digests % np.uint64(SAMPLE_ONE_IN) == 0


def first_difference(got: np.ndarray, got_spans: list[tuple[int, int]], want: list[int],
                     want_spans: list[tuple[int, int]]) -> str | None:
    """Where a shortcut's ids and supervised token ranges differ from the reference's, or None.

    >>> first_difference(np.array([1, 2, 3]), [(1, 3)], [1, 2, 3], [(1, 3)]) is None
    True
    >>> first_difference(np.array([1, 9, 3]), [(1, 3)], [1, 2, 2, 3], [(1, 4)])
    'token 1: 9 where the reference has 2 (3 tokens, the reference 4)'
    >>> first_difference(np.array([1, 2, 3]), [(2, 3)], [1, 2, 3], [(1, 3)])
    'supervised tokens [(2, 3)] where the reference has [(1, 3)]'
    """
    want_array = np.asarray(want, dtype=np.int64)
    if len(got) != len(want_array) or not np.array_equal(got.astype(np.int64), want_array):
        n = min(len(got), len(want_array))
        differs = np.flatnonzero(got[:n].astype(np.int64) != want_array[:n])
        at = int(differs[0]) if len(differs) else n
        found = int(got[at]) if at < len(got) else "nothing"
        expected = int(want_array[at]) if at < len(want_array) else "nothing"
        return f"token {at}: {found} where the reference has {expected} ({len(got)} tokens, the reference {len(want)})"
    if list(got_spans) != list(want_spans):
        return f"supervised tokens {list(got_spans)} where the reference has {list(want_spans)}"
    return None


def render_difference(got, want) -> str | None:
    """Where a conversation rendered once (``got``) differs from the exact rendering (``want``), or None.

    >>> from packtrain.pipeline.format.format import Formatted
    >>> render_difference(Formatted("ab<e>", ((1, 5),)), Formatted("ab<e>", ((1, 5),))) is None
    True
    >>> render_difference(Formatted("ab<e>", ((1, 5),)), Formatted("ab<e>", ((2, 5),)))
    'supervised characters [(1, 5)] where the exact rendering has [(2, 5)]'
    >>> render_difference(Formatted("ab<e>", ((1, 5),)), Formatted("ac<e>", ((1, 5),)))
    'text differs from the exact rendering at character 1'
    """
    if got.text != want.text:
        at = next((i for i, (a, b) in enumerate(zip(got.text, want.text)) if a != b), min(len(got.text), len(want.text)))
        return f"text differs from the exact rendering at character {at}"
    if got.spans != want.spans:
        return f"supervised characters {list(got.spans)} where the exact rendering has {list(want.spans)}"
    return None


@dataclass(frozen=True)
class Mismatch:
    """A document a shortcut made differently from the reference."""

    shortcut: str  # fast_encoder_label(...), LINE_CACHE or RENDER_ONCE
    row: int  # the row's index within its batch
    detail: str  # first_difference's words
    text: str  # the start of the document's text

    def describe(self) -> str:
        return f"{self.detail}, in the document starting {self.text[:60]!r}" if self.text else self.detail


class ShortcutMismatch(Exception):
    """Raised by the build when a checked document differs; it tokenizes again without the shortcut."""

    def __init__(self, mismatch: Mismatch, where: str):
        super().__init__(f"{mismatch.shortcut} differs from the HF tokenizer on {where}: {mismatch.describe()}")
        self.mismatch = mismatch


class Refusals:
    """A shortcut's refusal remembered in the cache directory (shared by every expert built there, like
    the fast-encoder decision), one note per ``key`` (what the refusal is about)."""

    def __init__(self, cache_dir: Path, notes: str, key: str):
        self.about = key
        self.path = note_file(Path(cache_dir) / notes, key)

    def refused(self) -> str | None:
        """Why the shortcut was refused by an earlier build, or None."""
        note = read_note(self.path, self.about, lambda n: isinstance(n, dict) and n.get("on") is False
                         and isinstance(n.get("why"), str))
        return None if note is None else note["why"]

    def remember(self, why: str) -> None:
        write_note(self.path, self.about, {"on": False, "why": why, "tokenizers": library_version("tokenizers")})


def line_cache_refusals(cache_dir: Path, content_hash: str) -> Refusals:
    """The line cache's refusal for a tokenizer content, under this tokenizers version and line cut."""
    return Refusals(cache_dir, LINE_CACHE_NOTES, f"{content_hash} tokenizers {library_version('tokenizers')} "
                                                 f"cut {CUT_VERSION}")


def render_once_refusals(cache_dir: Path, template: str | None) -> Refusals:
    """The one-render shortcut's refusal for a chat template, under this jinja2 version."""
    return Refusals(cache_dir, RENDER_ONCE_NOTES, f"{template} jinja2 {library_version('jinja2')} "
                                                  f"once {chat_once.VERSION}")
