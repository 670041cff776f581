"""Supervised spans on the tokens of an encoder that gives no character offsets (fastokens, tiktoken).

The reference places a document's supervised character spans on its tokens with the HF tokenizer's
offsets (pipeline/encode/worker.py ``token_spans``): a span must start where a token starts, and it
covers every token that starts before its end. A byte-level BPE token stands for a fixed number of
bytes of the text (its vocabulary entry's bytes; an added token's UTF-8 content), so the same
placement follows from one cumulative sum of the tokens' byte lengths, with no per-token Python:

    text   "Q?\\nSELECT 1"   span (3, 11): "SELECT 1"
    tokens  "Q" "?\\n" "SELECT" " 1"      byte ends 1 3 9 11
    the span starts at byte 3, the end of token 1: its tokens are [2, 4)

Where that cannot decide as the offsets would, the document is left to the reference (None): a span
starting inside a token (the reference refuses such a row, and says why), a span starting at the
end of the text, a text the normalizer would change (byte positions are in the normalized text),
spans out of order or overlapping, and, where the post-processor trims offsets (GPT-2's
``trim_offsets``), a span edge next to whitespace, which trimming moves. Every document placed here is also subject to the build's exactness check.
"""

from __future__ import annotations

import unicodedata
from itertools import chain

import numpy as np

Spans = list[tuple[int, int]]


class SpanPlacer:
    """Places documents' supervised spans on their tokens from the tokens' byte lengths."""

    def __init__(self, byte_lengths: np.ndarray, nfc: bool, trims: bool):
        self.byte_lengths = byte_lengths
        self.nfc = nfc  # the tokenizer normalizes with NFC: byte positions hold for NFC texts only
        self.trims = trims  # the post-processor trims offsets: whitespace at a span edge is the reference's to place

    def placeable(self, text: str, spans) -> bool:
        """Whether this document's spans can be placed here (else the reference encodes it)."""
        if self.nfc and not unicodedata.is_normalized("NFC", text):
            return False
        edges = [p for span in spans for p in span]
        if any(start >= len(text) for start, _ in spans) or edges != sorted(edges):
            return False  # a span at the end, or spans out of order or overlapping: the reference decides
        # trimmed offsets move an edge next to whitespace on either side
        return not (self.trims and any(text[q].isspace() for p in edges for q in (p - 1, p) if 0 <= q < len(text)))

    def place(self, texts: list[str], spans: list, ids: np.ndarray, counts: np.ndarray) -> list[Spans | None]:
        """Each document's spans as token ranges, or None where a span does not start on a token.
        ``ids``: every document's token ids concatenated, ``counts`` tokens each.

        >>> placer = SpanPlacer(np.array([1, 2, 6, 2]), nfc=False, trims=False)  # id -> bytes
        >>> ids, counts = np.array([0, 1, 2, 3, 0, 2, 1]), np.array([4, 3])
        >>> placer.place(["Q?\\nSELECT 1", "QSELECT?\\n"], [((3, 11),), ((1, 9),)], ids, counts)
        [[(2, 4)], [(1, 3)]]
        >>> placer.place(["Q?\\nSELECT 1"], [((2, 11),)], ids[:4], counts[:1])  # starts inside "?\\n"
        [None]
        >>> two = np.array([1, 1, 2, 3])  # "\u00e9" "?\\n" "SELECT" " 1": "\u00e9" is one character, two bytes
        >>> placer.place(["\u00e9?\\nSELECT 1"] * 2, [((3, 11),), ((2, 11),)], np.concatenate([two, two]), np.array([4, 4]))
        [[(2, 4)], None]
        """
        numbers = [len(doc_spans) for doc_spans in spans]
        if not sum(numbers):
            return [[] for _ in texts]
        token, inside = self.place_flat(texts, spans, ids, counts)
        token, inside = token.tolist(), inside.tolist()
        pairs = list(zip(token[0::2], token[1::2]))
        bounds = np.concatenate([[0], np.cumsum(numbers)]).tolist()
        return [None if inside[d] else pairs[bounds[d] : bounds[d + 1]] for d in range(len(texts))]

    def place_flat(self, texts: list[str], spans: list, ids: np.ndarray, counts: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`place` as arrays, with no Python list per document: every span edge's token (the spans
        of every document in order, start and stop; counted from its document's first token), and
        whether each document has a span starting inside a token (its edges are then meaningless).

        >>> placer = SpanPlacer(np.array([1, 2, 6, 2]), nfc=False, trims=False)
        >>> token, inside = placer.place_flat(["Q?\\nSELECT 1", "QSELECT?\\n"], [((3, 11),), ((1, 9),)],
        ...                                   np.array([0, 1, 2, 3, 0, 2, 1]), np.array([4, 3]))
        >>> token.tolist(), inside.tolist()
        ([2, 4, 1, 3], [False, False])
        """
        ends = np.cumsum(self.byte_lengths[ids])  # byte end of every token, all documents
        first = np.cumsum(counts) - counts  # each document's first token
        base = np.concatenate([[0], ends])[first]  # each document's first byte
        numbers = np.fromiter(map(len, spans), np.int64, len(spans))
        # characters: bytes where ASCII
        edges = np.fromiter(chain.from_iterable(chain.from_iterable(spans)), np.int64, 2 * int(numbers.sum()))
        at = 0
        for text, doc_spans, n in zip(texts, spans, numbers.tolist()):
            if not text.isascii():  # character -> byte positions, the text encoded once in pieces between the edges
                edges[at : at + 2 * n] = byte_edges(text, doc_spans)
            at += 2 * n
        owner = np.repeat(np.arange(len(texts)), numbers)
        at = base[owner].repeat(2) + edges
        # a token starts at byte b when the previous token ends there (or b is the document's first byte)
        starts = np.concatenate([[0], ends[:-1]]) if len(ends) else np.zeros(0, np.int64)
        k = np.searchsorted(starts, at, side="left")  # the first token starting at or after each edge
        lo, hi = first[owner].repeat(2), (first + counts)[owner].repeat(2)
        k = np.clip(k, lo, hi)
        on_start = (k < hi) & (starts[np.minimum(k, max(len(starts) - 1, 0))] == at) if len(starts) else k < hi
        # a span that starts inside a token leaves its document to the reference (which refuses it)
        inside = np.bincount(owner, ~on_start[0::2], len(texts)) > 0
        return k - lo, inside

    def suffixes_placeable(self, texts: list[str], prompt_chars: np.ndarray) -> np.ndarray:
        """:meth:`placeable` of prompt + answer documents (one span, from ``prompt_chars`` to the end), as bools.

        >>> SpanPlacer(np.array([1]), nfc=True, trims=False).suffixes_placeable(
        ...     ["ab", "e\u0301x", "abc"], np.array([1, 1, 3])).tolist()   # not NFC; a span at the end
        [True, False, False]
        """
        ok = prompt_chars < np.fromiter(map(len, texts), np.int64, len(texts))
        if self.nfc:
            ok &= np.fromiter((text.isascii() or unicodedata.is_normalized("NFC", text) for text in texts), bool,
                              len(texts))
        if self.trims:
            ok &= np.fromiter((self.placeable(text, ((start, len(text)),))
                               for text, start in zip(texts, prompt_chars.tolist())), bool, len(texts))
        return ok

    def place_suffixes(self, ids: np.ndarray, counts: np.ndarray, prompt_bytes: np.ndarray) -> np.ndarray:
        """:meth:`place` for documents whose one span runs from byte ``prompt_bytes`` to the end of the
        text (prompt + answer), all at once: each document's first supervised token, -1 where the span
        does not start on a token (the span's tokens then run from there to the document's last).

        >>> placer = SpanPlacer(np.array([1, 2, 6, 2]), nfc=False, trims=False)  # id -> bytes
        >>> placer.place_suffixes(np.array([0, 1, 2, 3, 0, 2, 1]), np.array([4, 3]), np.array([3, 2])).tolist()
        [2, -1]
        """
        ends = np.cumsum(self.byte_lengths[ids])  # byte end of every token, all documents
        first = np.cumsum(counts) - counts  # each document's first token
        at = np.concatenate([[0], ends])[first] + prompt_bytes  # each span's first byte, all documents
        starts = np.concatenate([[0], ends[:-1]]) if len(ends) else np.zeros(1, np.int64)
        k = np.clip(np.searchsorted(starts, at, side="left"), first, first + counts)
        on_start = (k < first + counts) & (starts[np.minimum(k, len(starts) - 1)] == at)
        return np.where(on_start, k - first, -1)


def byte_edges(text: str, spans) -> list[int]:
    """The spans' edges (character positions in ``text``) as UTF-8 byte positions, in order.

    >>> byte_edges("\u00e9?\\nSELECT 1", ((3, 11),))
    [4, 12]
    """
    out, at, byte = [], 0, 0
    for start, stop in spans:
        for edge in (start, stop):
            byte += len(text[at:edge].encode("utf-8"))
            out.append(byte)
            at = edge
    return out
