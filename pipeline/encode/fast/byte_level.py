"""GPT-2's byte-level alphabet: the 256 symbols a byte-level BPE vocabulary writes bytes with, and
the bytes each token of such a vocabulary stands for."""

from __future__ import annotations

import functools

import numpy as np


@functools.cache
def byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, symbol -> byte (the inverse of ``bytes_to_unicode``)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    symbols, extra = {}, 0
    for b in range(256):
        if b in printable:
            symbols[chr(b)] = b
        else:
            symbols[chr(256 + extra)] = b
            extra += 1
    return symbols


@functools.cache
def to_latin1() -> dict[int, str]:
    """str.translate table: byte-level symbol -> the latin-1 character of its byte; every other
    character below U+0100 -> U+FFFF, so that encoding to latin-1 fails on any non-symbol."""
    table = {c: "\uffff" for c in range(256)}
    table.update({ord(symbol): chr(b) for symbol, b in byte_decoder().items()})
    return table


def token_bytes(token: str) -> bytes | None:
    """The bytes a byte-level BPE token stands for; None if it is not in the byte-level alphabet."""
    try:
        return token.translate(to_latin1()).encode("latin-1")
    except UnicodeEncodeError:
        return None


def token_byte_lengths(spec: dict) -> np.ndarray | None:
    """The number of bytes each id of ``tokenizer.json`` ``spec`` stands for (a vocabulary token's
    bytes, an added token's UTF-8 content), or None where a vocabulary token is not in the
    byte-level alphabet. Each symbol of the alphabet is one byte, so a token's length is its number
    of characters once the whole vocabulary is found in the alphabet (one translate, no per-token call).

    >>> token_byte_lengths({"model": {"vocab": {"a": 0, "Ġb": 1, "Ċ": 2, "x": 3}},
    ...                     "added_tokens": [{"id": 3, "content": "<|é|>"}]}).tolist()
    [1, 2, 1, 6]
    >>> token_byte_lengths({"model": {"vocab": {"a": 0, "中": 1}}}) is None  # not a symbol
    True
    """
    vocab = (spec.get("model") or {}).get("vocab")
    if not isinstance(vocab, dict) or not vocab:
        return None
    added = {t["id"]: t["content"] for t in spec.get("added_tokens") or []}
    plain = [(token, rank) for token, rank in vocab.items() if rank not in added]
    if not in_alphabet("".join(token for token, _ in plain)):
        return None
    lengths = np.zeros(max(list(vocab.values()) + list(added)) + 1, dtype=np.int64)
    for token, rank in plain:
        lengths[rank] = len(token)
    for rank, content in added.items():
        lengths[rank] = len(content.encode("utf-8"))
    return lengths


def in_alphabet(text: str) -> bool:
    """Whether every character of ``text`` is a symbol of the byte-level alphabet."""
    try:
        text.translate(to_latin1()).encode("latin-1")
    except UnicodeEncodeError:
        return False
    return True


def single_bytes(spec: dict) -> bytes:
    """The bytes that ``tokenizer.json`` ``spec``'s vocabulary has a one-byte token for.

    >>> single_bytes({"model": {"vocab": {"b": 0, "a": 1, "Ġ": 2, "ab": 3, "中": 4}}})
    b' ab'
    """
    symbols = byte_decoder()
    return bytes(sorted({symbols[token] for token in (spec.get("model") or {}).get("vocab") or {}
                         if len(token) == 1 and token in symbols}))


def trims_offsets(spec: dict) -> bool:
    """Whether ``tokenizer.json`` ``spec``'s post-processor (or one in its sequence) trims whitespace
    off the tokens' offsets (GPT-2's ByteLevel ``trim_offsets``), which moves span edges at whitespace.

    >>> trims_offsets({"post_processor": {"type": "Sequence", "processors": [
    ...     {"type": "ByteLevel", "trim_offsets": True}, {"type": "TemplateProcessing"}]}})
    True
    >>> trims_offsets({"post_processor": {"type": "ByteLevel", "trim_offsets": False}}), trims_offsets({})
    (False, False)
    """
    processor = spec.get("post_processor") or {}
    steps = processor.get("processors", []) if processor.get("type") == "Sequence" else [processor]
    return any(bool(step.get("trim_offsets")) for step in steps)
